"""Tests of tff_partial/measure/comm.py: exact bytes per client from TFF types."""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_partial.measure import comm

_INPUT_SPEC = collections.OrderedDict(
    x=tf.TensorSpec([None, 2], tf.float32),
    y=tf.TensorSpec([None, 1], tf.int32),
)


def _keras_model():
  """dense1: 2x3 + 3 = 9 trainable; dense2: 3x2 + 2 = 8 frozen parameters."""
  model = tf.keras.Sequential([
      tf.keras.layers.Input(shape=(2,)),
      tf.keras.layers.Dense(3, name='dense1'),
      tf.keras.layers.Dense(2, name='dense2'),
  ])
  model.get_layer('dense2').trainable = False
  return model


def _model_fn():
  return tff.learning.models.from_keras_model(
      _keras_model(),
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=_INPUT_SPEC,
  )


class TypeBytesTest(tf.test.TestCase):

  def test_tensor_bytes_are_elements_times_itemsize(self):
    self.assertEqual(comm.tensor_bytes(tff.TensorType(np.float32, [3, 4])), 48)
    self.assertEqual(comm.tensor_bytes(tff.TensorType(np.int64, [2])), 16)
    self.assertEqual(comm.tensor_bytes(tff.TensorType(np.float32)), 4)

  def test_type_bytes_sums_struct_and_federated_leaves(self):
    value = tff.StructType([
        ('w', tff.TensorType(np.float32, [10])),
        ('seed', tff.TensorType(np.int32, [2])),
        ('lr', tff.TensorType(np.float32)),
    ])
    self.assertEqual(comm.type_bytes(value), 40 + 8 + 4)
    self.assertEqual(comm.type_bytes(tff.FederatedType(value, tff.CLIENTS)), 52)

  def test_unknown_shape_raises_value_error(self):
    with self.assertRaisesRegex(ValueError, 'no static size'):
      comm.tensor_bytes(tff.TensorType(np.float32, [None, 3]))

  def test_sequence_crossing_the_boundary_raises_value_error(self):
    with self.assertRaisesRegex(ValueError, 'sequence type'):
      comm.type_bytes(tff.SequenceType(tff.TensorType(np.float32, [2])))

  def test_client_bytes_add(self):
    total = comm.ClientBytes(1, 2, 3, 4) + comm.ClientBytes(10, 20, 30, 40)
    self.assertEqual(total, comm.ClientBytes(11, 22, 33, 44))
    self.assertEqual((total.down_total, total.up_total), (33, 77))


class FedAvgBytesTest(tf.test.TestCase):

  def test_fedavg_moves_all_weights_down_and_trainable_up(self):
    params, trainable = 17, 9
    process = tff.learning.algorithms.build_weighted_fed_avg(
        _model_fn,
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=0.1),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
    )
    got = comm.client_bytes(process.next)
    self.assertEqual(got.down_payload, 4 * params)
    self.assertEqual(got.up_payload, 4 * trainable)
    # Down, besides the model: the client optimizer's learning rate (float32).
    self.assertEqual(got.down_overhead, 4)
    # Up, besides the update: the metric sums (loss total and count as
    # float32, num_examples and num_batches as int64) and the float32 weight.
    self.assertEqual(got.up_overhead, 2 * 4 + 2 * 8 + 4)

    weights_type = tff.learning.models.weights_type_from_model(_model_fn)
    self.assertEqual(
        comm.fedavg_bytes(weights_type),
        comm.ClientBytes(down_payload=4 * params, up_payload=4 * trainable))


if __name__ == '__main__':
  tf.test.main()
