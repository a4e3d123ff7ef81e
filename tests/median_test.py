"""Tests of tff_partial.privacy.median: coordinate-wise median aggregation."""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_partial.privacy import median

_VT = tff.types.to_type(collections.OrderedDict(
    w=tff.TensorType(np.float32, [2, 2]), b=[tff.TensorType(np.float32, [3])]))


def _v(w, b):
  return collections.OrderedDict(w=np.array(w, np.float32), b=[np.array(b, np.float32)])


class CoordinateMedianTest(tf.test.TestCase):

  def test_type_signature(self):
    process = median.CoordinateMedianFactory().create(_VT)
    self.assertTrue(process.next.type_signature.result.result.member.is_equivalent_to(_VT))

  def test_odd_and_even_counts(self):
    process = median.CoordinateMedianFactory().create(_VT)
    state = process.initialize()
    clients = [_v([[1, 9], [3, 0]], [5, 1, 2]), _v([[2, 8], [1, 0]], [4, 1, 7]),
               _v([[7, 7], [2, 0]], [6, 1, 3])]
    out = process.next(state, clients)
    self.assertAllClose(out.result['w'], [[2, 8], [2, 0]])
    self.assertAllClose(out.result['b'][0], [5, 1, 3])
    out = process.next(state, clients[:2])
    self.assertAllClose(out.result['w'], [[1.5, 8.5], [2, 0]])

  def test_ignores_one_client_scaled_by_1e6_where_mean_does_not(self):
    rng = np.random.default_rng(0)
    honest = [_v(rng.normal(1.0, 0.1, (2, 2)), rng.normal(-1.0, 0.1, 3)) for _ in range(4)]
    attacker = _v(honest[0]['w'] * 1e6, honest[0]['b'][0] * 1e6)
    clients = honest + [attacker]
    med = median.CoordinateMedianFactory().create(_VT)
    mean = tff.aggregators.UnweightedMeanFactory().create(_VT)
    med_out = med.next(med.initialize(), clients).result
    mean_out = mean.next(mean.initialize(), clients).result
    honest_w = np.stack([c['w'] for c in honest])
    # The median stays inside the honest clients' range ...
    self.assertAllInRange(med_out['w'], honest_w.min() - 1e-6, honest_w.max() + 1e-6)
    self.assertLess(np.max(np.abs(med_out['b'][0] + 1.0)), 0.5)
    # ... the mean is dragged ~2e5 away.
    self.assertGreater(np.min(np.abs(mean_out['w'])), 1e4)

  def test_works_as_fedavg_model_aggregator(self):
    def model_fn():
      keras_model = tf.keras.Sequential([
          tf.keras.layers.InputLayer(input_shape=(2,)),
          tf.keras.layers.Dense(1, kernel_initializer='zeros', name='dense')])
      return tff.learning.models.from_keras_model(
          keras_model, loss=tf.keras.losses.MeanSquaredError(),
          input_spec=(tf.TensorSpec([None, 2], tf.float32),
                      tf.TensorSpec([None, 1], tf.float32)))
    process = tff.learning.algorithms.build_unweighted_fed_avg(
        model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
        model_aggregator=median.build_median_factory())
    data = tf.data.Dataset.from_tensor_slices(
        (np.ones((4, 2), np.float32), np.ones((4, 1), np.float32))).batch(2)
    state = process.initialize()
    out = process.next(state, [data, data, data])
    weights = process.get_model_weights(out.state).trainable
    self.assertGreater(float(np.sum(weights[0])), 0.0)  # it learned towards y=1

  def test_rejects_integer_values(self):
    with self.assertRaisesRegex(ValueError, 'floating'):
      median.CoordinateMedianFactory().create(tff.TensorType(np.int32, [3]))


if __name__ == '__main__':
  tf.test.main()
