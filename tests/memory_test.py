"""Client peak memory measurement (tff_partial/measure/memory.py)."""

import tensorflow as tf

from tff_partial.measure import memory


def _model():
  # Module-level so that it pickles into the measuring subprocess.
  return tf.keras.Sequential([
      tf.keras.Input((256,)),
      tf.keras.layers.Dense(512, activation='relu', name='dense1'),
      tf.keras.layers.Dense(512, activation='relu', name='dense2'),
      tf.keras.layers.Dense(10, name='dense3'),
  ])


def _loss():
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


class MemoryTest(tf.test.TestCase):

  def test_pvt_needs_less_extra_memory_than_all_variable_training(self):
    avt = memory.client_training_peak(_model, _loss, (256,), 128, num_classes=10)
    # Freeze the two big kernels (PVT): only dense3 and the biases train.
    pvt = memory.client_training_peak(
        _model, _loss, (256,), 128,
        trainable_mask=[False, True, False, True, True, True], num_classes=10)
    weights = 4 * (256 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10)
    self.assertEqual(avt['weights_bytes'], weights)
    self.assertEqual(avt['trained_bytes'], weights)
    self.assertEqual(pvt['trained_bytes'], 4 * (512 + 512 + 512 * 10 + 10))
    # Same forward pass in both; it holds at least the weights and the batch.
    self.assertEqual(avt['forward_peak'], pvt['forward_peak'])
    self.assertGreater(avt['forward_peak'], weights + 4 * 128 * 256)
    print('AVT', avt, 'PVT', pvt)
    # Training all variables forms the big kernels' gradients (TF frees each
    # once applied, so at least the largest, dense2's 1 MiB, is held); PVT
    # forms neither.
    self.assertGreater(avt['extra'], 4 * 512 * 512)
    self.assertLess(pvt['extra'], avt['extra'] - 4 * 256 * 512)

  def test_bad_input(self):
    with self.assertRaisesRegex(ValueError, 'picklable'):
      memory.client_training_peak(lambda: _model(), _loss, (256,), 8)
    with self.assertRaisesRegex(ValueError, 'mode'):
      memory.measure_step_peak(_model, _loss, (256,), 8, mode='backward')


if __name__ == '__main__':
  tf.test.main()
