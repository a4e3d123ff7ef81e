"""Masked mean aggregator (tff_partial/masks/masked_mean.py)."""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_partial.masks import masked_mean

_UPDATE = tff.StructWithPythonType(
    [tff.TensorType(np.float32, [2]), tff.TensorType(np.float32, [3]),
     tff.TensorType(np.float32, [])], list)
_VALUE = tff.StructWithPythonType(
    [('update', _UPDATE), ('mask', tff.TensorType(np.float32, [3]))],
    collections.OrderedDict)
_WEIGHT = tff.TensorType(np.float32)


def _client(update, mask):
  return collections.OrderedDict(
      update=[np.asarray(u, np.float32) for u in update],
      mask=np.asarray(mask, np.float32))


class MaskedMeanTest(tf.test.TestCase):

  def test_type_signature(self):
    process = masked_mean.MaskedMeanFactory().create(_VALUE, _WEIGHT)
    result_type = process.next.type_signature.result
    self.assertTrue(result_type.result.member.update.is_equivalent_to(_UPDATE))
    self.assertTrue(result_type.result.member.trained.is_equivalent_to(
        tff.TensorType(np.bool_, [3])))
    self.assertTrue(result_type.measurements.member.clients_per_variable
                    .is_equivalent_to(tff.TensorType(np.int32, [3])))

  def test_exact_per_variable_means_and_counts(self):
    process = masked_mean.MaskedMeanFactory().create(_VALUE, _WEIGHT)
    clients = [
        # Frozen entries carry junk: the aggregator must ignore them.
        _client([[1., 2.], [9., 9., 9.], 1.], [1, 0, 1]),
        _client([[3., 4.], [1., 1., 1.], 9.], [1, 1, 0]),
        _client([[9., 9.], [2., 4., 6.], 9.], [0, 1, 0]),
    ]
    weights = [1., 3., 4.]
    out = process.next(process.initialize(), clients, weights)
    update = out.result['update']
    # var 0: clients 0, 1 -> (1*[1,2] + 3*[3,4]) / 4.
    np.testing.assert_allclose(update[0], [2.5, 3.5], rtol=1e-6)
    # var 1: clients 1, 2 -> (3*[1,1,1] + 4*[2,4,6]) / 7.
    np.testing.assert_allclose(update[1], np.array([11., 19., 27.]) / 7, rtol=1e-6)
    # var 2: client 0 only.
    self.assertAllClose(update[2], 1.0)
    np.testing.assert_array_equal(out.result['trained'], [True, True, True])
    np.testing.assert_array_equal(out.measurements['clients_per_variable'], [2, 2, 1])

  def test_untrained_variable_is_zero_not_nan(self):
    process = masked_mean.MaskedMeanFactory().create(_VALUE, _WEIGHT)
    clients = [_client([[1., 2.], [3., 3., 3.], 5.], [1, 0, 0]),
               _client([[3., 4.], [3., 3., 3.], 5.], [1, 0, 0])]
    out = process.next(process.initialize(), clients, [1., 1.])
    np.testing.assert_allclose(out.result['update'][0], [2., 3.])
    np.testing.assert_array_equal(out.result['update'][1], np.zeros(3))
    self.assertEqual(out.result['update'][2], 0.0)
    np.testing.assert_array_equal(out.result['trained'], [True, False, False])
    np.testing.assert_array_equal(out.measurements['clients_per_variable'], [2, 0, 0])

  def test_all_ones_mask_equals_mean_factory(self):
    process = masked_mean.MaskedMeanFactory().create(_VALUE, _WEIGHT)
    reference = tff.aggregators.MeanFactory().create(_UPDATE, _WEIGHT)
    rng = np.random.default_rng(0)
    updates = [[rng.normal(size=2), rng.normal(size=3), rng.normal()] for _ in range(3)]
    weights = [3., 5., 11.]
    out = process.next(process.initialize(), [_client(u, [1, 1, 1]) for u in updates], weights)
    ref = reference.next(reference.initialize(),
                         [[np.asarray(x, np.float32) for x in u] for u in updates], weights)
    for a, b in zip(out.result['update'], ref.result):
      np.testing.assert_array_equal(a, b)  # bit-identical

  def test_inner_sum_factory_is_used(self):
    # A clipping sum inside (norm 1 per client) changes the value sum only.
    inner = tff.aggregators.clipping_factory(1.0, tff.aggregators.SumFactory())
    process = masked_mean.MaskedMeanFactory(value_sum_factory=inner).create(_VALUE, _WEIGHT)
    clients = [_client([[3., 4.], [0., 0., 0.], 0.], [1, 1, 1])]
    out = process.next(process.initialize(), clients, [1.])
    np.testing.assert_allclose(out.result['update'][0], [0.6, 0.8], rtol=1e-6)
    self.assertIn('clipping', str(out.measurements['mean_value']) + str(
        process.next.type_signature.result.measurements))

  def test_bad_types(self):
    with self.assertRaisesRegex(ValueError, 'update=U, mask'):
      masked_mean.MaskedMeanFactory().create(_UPDATE, _WEIGHT)
    bad_mask = tff.StructWithPythonType(
        [('update', _UPDATE), ('mask', tff.TensorType(np.float32, [2]))],
        collections.OrderedDict)
    with self.assertRaisesRegex(ValueError, r'float32\[3\]'):
      masked_mean.MaskedMeanFactory().create(bad_mask, _WEIGHT)
    with self.assertRaisesRegex(ValueError, 'UnweightedAggregationFactory'):
      masked_mean.MaskedMeanFactory(value_sum_factory=tff.aggregators.MeanFactory())


if __name__ == '__main__':
  tf.test.main()
