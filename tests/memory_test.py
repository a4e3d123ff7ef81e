"""Client peak memory measurement (tff_partial/measure/memory.py).

CI runs this file under both CPU paths (TF_ENABLE_ONEDNN_OPTS=0 and =1, see
the Makefile); the figures must not depend on it.
"""

import tensorflow as tf

from tff_partial.measure import memory

_BATCH = 128
# (256 -> 512 -> 512 -> 10) float32 MLP: its exact sizes in bytes.
_WEIGHTS = 4 * (256 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10)
_ACTIVATION = 4 * _BATCH * 512  # one hidden layer's output
# PVT: freeze the two big kernels; dense3 and the biases train.
_PVT_MASK = [False, True, False, True, True, True]
# The allocator and the graph count differ only by BFC's rounding of small
# tensors to 256-byte chunks (measured: 0.18% for AVT, 0.03% for PVT).
_TOLERANCE = 0.01


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

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.steps = {
        (name, mode): memory.measure_step_peak(
            _model, _loss, (256,), _BATCH, mode=mode,
            trainable_mask=mask if mode == 'train' else None, num_classes=10)
        for name, mask in (('avt', None), ('pvt', _PVT_MASK))
        for mode in ('forward', 'train')}

  def test_pvt_needs_less_extra_memory_than_all_variable_training(self):
    avt = memory.client_training_peak(_model, _loss, (256,), _BATCH, num_classes=10)
    # The same figures in other fresh processes.
    self.assertEqual(avt['forward_peak'], self.steps['avt', 'forward']['peak'])
    self.assertEqual(avt['train_peak'], self.steps['avt', 'train']['peak'])
    self.assertEqual(avt['forward_peak'], self.steps['pvt', 'forward']['peak'])
    pvt_extra = self.steps['pvt', 'train']['peak'] - self.steps['pvt', 'forward']['peak']
    pvt = self.steps['pvt', 'train']
    self.assertEqual(avt['weights_bytes'], _WEIGHTS)
    self.assertEqual(avt['trained_bytes'], _WEIGHTS)
    self.assertEqual(avt['gradient_bytes'], _WEIGHTS)
    self.assertEqual(pvt['trained_bytes'], 4 * (512 + 512 + 512 * 10 + 10))
    self.assertEqual(pvt['gradient_bytes'], pvt['trained_bytes'])
    # The forward pass holds weights, batch, and two hidden outputs at once.
    self.assertEqual(avt['forward_peak'], _WEIGHTS + 4 * _BATCH * (256 + 1) + 2 * _ACTIVATION)
    # Both keep the same activations for the backward pass (dense1's bias
    # still needs the gradient through both hidden layers): the two hidden
    # outputs plus the logits-sized and per-example tensors of the loss.
    for kept in (avt['kept_bytes'], pvt['kept_bytes']):
      self.assertBetween(kept - 2 * _ACTIVATION, 4 * _BATCH * 11, 4 * _BATCH * 11 + 64)
    # All-variable training holds every gradient before applying them; PVT
    # forms neither big kernel's gradient and saves at least dense2's (1 MiB).
    self.assertGreater(avt['extra'], avt['gradient_bytes'] - _ACTIVATION)
    self.assertGreaterEqual(avt['extra'] - pvt_extra, 4 * 512 * 512)

  def test_allocator_agrees_with_the_graph_count(self):
    # The allocator's bytes of one step against a count read from the traced
    # graph: the tensors alive at once (the activations the backward pass
    # keeps, the gradients, tensors in flight) in the same order.
    for key, r in self.steps.items():
      self.assertLessEqual(abs(r['step_peak'] - r['graph_step_peak']),
                           _TOLERANCE * r['graph_step_peak'], (key, r))
    # AVT's peak is when all gradients exist; of what the backward pass kept
    # only the last hidden output (and the loss's small tensors) is left.
    r = self.steps['avt', 'train']
    self.assertBetween(r['graph_step_peak'] - r['gradient_bytes'],
                       _ACTIVATION, _ACTIVATION + 4 * _BATCH * 11 + 64)

  def test_bad_input(self):
    with self.assertRaisesRegex(ValueError, 'picklable'):
      memory.client_training_peak(lambda: _model(), _loss, (256,), 8)
    with self.assertRaisesRegex(ValueError, 'mode'):
      memory.measure_step_peak(_model, _loss, (256,), 8, mode='backward')
    with self.assertRaisesRegex(ValueError, 'trainable_mask has 2 entries'):
      memory.measure_step_peak(_model, _loss, (256,), 8, trainable_mask=[True, False])


if __name__ == '__main__':
  tf.test.main()
