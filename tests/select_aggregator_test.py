"""Tests of tff_partial/select/aggregator.py: per-key means on hand-made updates."""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_partial.measure import comm
from tff_partial.select import aggregator
from tff_partial.select import slicing


def mlp():
  return tf.keras.Sequential([
      tf.keras.layers.Input(shape=(2,)),
      tf.keras.layers.Dense(4, name='dense1'),   # kernel [2,4], bias [4]
      tf.keras.layers.Dense(1, name='dense2'),   # kernel [4,1], bias [1]
  ])


def _spec():
  return slicing.make_select_spec(
      mlp(), [slicing.GroupConfig(['dense1'], 2, structured=False)])


def _upload(keys, unit_values, bias2):
  """A client's update: unit k of dense1 gets value v everywhere."""
  keys = np.array(keys, np.int32)
  v = np.array(unit_values, np.float32)
  # Slices are [m, *view-with-B-at-the-key-axis] (bucket size B = 1).
  kernel1 = np.stack([v, -v], axis=1).reshape(2, 2, 1)  # kernel1 columns
  return collections.OrderedDict(
      keys=collections.OrderedDict(dense1=keys),
      slices=collections.OrderedDict(dense1=(
          kernel1,                               # [m, 2, 1]
          v.reshape(2, 1),                       # bias1 [m, 1]
          (10 * v).reshape(2, 1, 1),             # kernel2 rows [m, 1, 1]
      )),
      broadcast=(np.array([bias2], np.float32),))


# Client A (weight 1): units 0, 2 -> 1, 3; client B (weight 3): units 2, 3 -> 5, 7.
_UPLOADS = [_upload([0, 2], [1.0, 3.0], 2.0), _upload([2, 3], [5.0, 7.0], 6.0)]
_WEIGHTS = [1.0, 3.0]
# Per-key weighted means: unit 0: 1; unit 1: nobody (0); unit 2: (3 + 15)/4 =
# 4.5; unit 3: 7. Broadcast bias2: (2 + 18)/4 = 5.
_PER_KEY = np.array([1.0, 0.0, 4.5, 7.0], np.float32)


class DeselectMeanTest(tf.test.TestCase):

  def _check_per_key_means(self, result):
    kernel1, bias1, kernel2, bias2 = result
    self.assertAllClose(kernel1, np.stack([_PER_KEY, -_PER_KEY]))
    self.assertAllClose(bias1, _PER_KEY)
    self.assertAllClose(kernel2, (10 * _PER_KEY).reshape(4, 1))
    self.assertAllClose(bias2, [5.0])

  def _process(self, factory):
    spec = _spec()
    return factory.create(aggregator.upload_type(spec), tff.TensorType(np.float32))

  def test_sparse_per_key_weighted_means(self):
    process = self._process(aggregator.DeselectMeanFactory(_spec()))
    out = process.next(process.initialize(), _UPLOADS, _WEIGHTS)
    self._check_per_key_means(out.result)
    # Clients send keys + slices (+ their weight), not the dense model.
    up = comm.client_bytes(process.next)
    slice_floats = 2 * 2 + 2 + 2 * 1  # m=2 keys of (kernel column, bias, row)
    self.assertEqual(up.up_payload, 4 * (2 + slice_floats + 1))
    self.assertEqual(up.up_overhead, 4)

  def test_dense_with_inner_sum_factories(self):
    process = self._process(aggregator.DeselectMeanFactory(
        _spec(), value_sum_factory=tff.aggregators.SumFactory()))
    out = process.next(process.initialize(), _UPLOADS, _WEIGHTS)
    self._check_per_key_means(out.result)
    # Dense inner sums: each client uploads the whole dense update + counts.
    up = comm.client_bytes(process.next)
    self.assertEqual(up.up_payload, 4 * (8 + 4 + 4 + 1 + 4))

  def test_paper_mean_with_tff_mean_factory(self):
    process = self._process(aggregator.DeselectMeanFactory.paper_mean(
        _spec(), tff.aggregators.MeanFactory()))
    out = process.next(process.initialize(), _UPLOADS, _WEIGHTS)
    # Eq. (5): weighted mean over all clients of phi(u_n, z_n) (zeros where a
    # client did not select): unit 0: 1/4, unit 2: (3 + 15)/4, unit 3: 21/4.
    expected = np.array([0.25, 0.0, 4.5, 5.25], np.float32)
    self.assertAllClose(out.result[1], expected)
    self.assertAllClose(out.result[3], [5.0])


if __name__ == '__main__':
  tf.test.main()
