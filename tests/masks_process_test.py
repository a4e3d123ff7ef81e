"""build_pvt_process (tff_partial/masks/process.py, client_work.py)."""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_partial import masks
from tff_partial.masks import variable_types as vt

_SPEC = collections.OrderedDict(
    x=tf.TensorSpec([None, 4], tf.float32), y=tf.TensorSpec([None, 1], tf.int32))


def _keras_model():
  return tf.keras.Sequential([
      tf.keras.Input((4,)),
      tf.keras.layers.Dense(5, activation='relu', name='dense1'),
      tf.keras.layers.LayerNormalization(name='ln'),
      tf.keras.layers.Dense(3, name='dense2'),
  ])


def _model_fn():
  return tff.learning.models.from_keras_model(
      _keras_model(),
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=_SPEC,
      metrics=[tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')])


def _datasets(num_clients=3, seed=0):
  rng = np.random.default_rng(seed)
  out = []
  for k in range(num_clients):
    n = 4 + 3 * k
    out.append(tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
        x=rng.normal(size=(n, 4)).astype(np.float32),
        y=rng.integers(0, 3, size=(n, 1)).astype(np.int32))).batch(3))
  return out


def _initial_weights(seed=1):
  tf.keras.utils.set_random_seed(seed)
  return tff.learning.models.ModelWeights.from_model(_keras_model())


def _sgd(lr):
  return tff.learning.optimizers.build_sgdm(learning_rate=lr)


class PvtProcessTest(tf.test.TestCase):

  def test_type_signature(self):
    process = masks.build_pvt_process(_model_fn, client_optimizer_fn=_sgd(0.1))
    client_data = process.next.type_signature.parameter[1]
    self.assertEqual(client_data.placement, tff.CLIENTS)
    self.assertTrue(client_data.member.mask.is_equivalent_to(
        tff.SequenceType(tff.TensorType(np.float32, [6]))))
    measurements = process.next.type_signature.result.metrics.member
    self.assertTrue(measurements.aggregator.clients_per_variable.is_equivalent_to(
        tff.TensorType(np.int32, [6])))

  def test_pcpr_with_zero_fraction_equals_fedavg(self):
    # With either client loop (TFF's dataset.reduce default, and the iterator
    # loop the binaries use), PCPR at fraction 0 is TFF's FedAvg bit for bit.
    for loop in tff.learning.LoopImplementation:
      with self.subTest(loop=loop.name):
        self._assert_pcpr_zero_equals_fedavg(loop)

  def _assert_pcpr_zero_equals_fedavg(self, loop):
    # Server SGD with momentum so that two rounds exercise the optimizer state.
    fedavg = tff.learning.algorithms.build_weighted_fed_avg(
        _model_fn, client_optimizer_fn=_sgd(0.1),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0, momentum=0.9),
        loop_implementation=loop)
    pvt = masks.build_pvt_process(
        _model_fn, client_optimizer_fn=_sgd(0.1),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0, momentum=0.9),
        loop_implementation=loop)
    types = vt.classify_variables(_keras_model())
    sampler = masks.MaskSampler(types, 'per_client_per_round', 0.0, seed=3)
    initial = _initial_weights()
    fed_state = fedavg.set_model_weights(fedavg.initialize(), initial)
    pvt_state = pvt.set_model_weights(pvt.initialize(), initial)
    for round_num in range(1, 3):
      data = _datasets(seed=round_num)
      fed_state = fedavg.next(fed_state, data).state
      pvt_out = pvt.next(pvt_state, [
          masks.client_input(d, sampler.mask(round_num, k)) for k, d in enumerate(data)])
      pvt_state = pvt_out.state
      np.testing.assert_array_equal(
          pvt_out.metrics['aggregator']['clients_per_variable'], [3] * 6)
    fed_weights = fedavg.get_model_weights(fed_state).trainable
    pvt_weights = pvt.get_model_weights(pvt_state).trainable
    for a, b, c in zip(fed_weights, pvt_weights, initial.trainable):
      self.assertFalse(np.array_equal(a, c))  # training moved every variable
      np.testing.assert_array_equal(a, b)  # bit-identical to TFF's FedAvg

  def test_static_mask_differentiates_only_trained_variables_same_result(self):
    # The fixed scheme's mask is known at build time: clients take gradients of
    # the trained variables only, with the same result as the runtime mask.
    mask = np.array([0, 1, 0, 1, 1, 0], np.float32)
    dynamic = masks.build_pvt_process(_model_fn, client_optimizer_fn=_sgd(0.1))
    static = masks.build_pvt_process(
        _model_fn, client_optimizer_fn=_sgd(0.1), static_mask=mask.astype(bool))
    initial = _initial_weights()
    data = [masks.client_input(d, mask) for d in _datasets()]
    results = []
    for process in (dynamic, static):
      state = process.set_model_weights(process.initialize(), initial)
      results.append(process.get_model_weights(process.next(state, data).state).trainable)
    for i, (a, b, c) in enumerate(zip(*results, initial.trainable)):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
      self.assertEqual(bool(mask[i]), not np.array_equal(a, c))
    with self.assertRaisesRegex(Exception, 'differs from the static'):
      state = static.set_model_weights(static.initialize(), initial)
      static.next(state, [masks.client_input(d, np.ones(6, np.float32)) for d in _datasets()])

  def test_untrained_variables_keep_their_values(self):
    # Server momentum would move a variable with a zero update in round 2;
    # a variable nobody trained must not move at all.
    pvt = masks.build_pvt_process(
        _model_fn, client_optimizer_fn=_sgd(0.1),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0, momentum=0.9))
    state = pvt.set_model_weights(pvt.initialize(), _initial_weights())
    data = _datasets()
    ones = np.ones(6, np.float32)
    state = pvt.next(state, [masks.client_input(d, ones) for d in data]).state
    before = pvt.get_model_weights(state).trainable
    mask = np.array([0, 1, 0, 1, 1, 0], np.float32)  # dense1/kernel, ln/gamma, dense2/bias frozen
    out = pvt.next(state, [masks.client_input(d, mask) for d in data])
    after = pvt.get_model_weights(out.state).trainable
    np.testing.assert_array_equal(out.metrics['aggregator']['clients_per_variable'],
                                  [0, 3, 0, 3, 3, 0])
    for i, (a, b) in enumerate(zip(before, after)):
      if mask[i]:
        self.assertFalse(np.array_equal(a, b), f'variable {i} should train')
      else:
        np.testing.assert_array_equal(a, b)

  def test_each_variable_averages_only_its_trainers(self):
    # Client A freezes dense1/kernel; B trains everything. With server SGD at
    # learning rate 1, dense1/kernel moves by B's delta alone, every other
    # variable by the example-weighted (4 and 7) mean of both deltas.
    pvt = masks.build_pvt_process(_model_fn, client_optimizer_fn=_sgd(0.1))
    client_work = masks.client_work.build_pvt_client_work(_model_fn, _sgd(0.1))
    initial = _initial_weights()
    a_data, b_data = _datasets(2, seed=5)
    a_in = masks.client_input(a_data, np.array([0, 1, 1, 1, 1, 1], np.float32))
    b_in = masks.client_input(b_data, np.ones(6, np.float32))
    state = pvt.set_model_weights(pvt.initialize(), initial)
    after = pvt.get_model_weights(pvt.next(state, [a_in, b_in]).state).trainable
    results = client_work.next(
        client_work.initialize(), [initial, initial], [a_in, b_in]).result
    ua, ub = (r.update['update'] for r in results)
    self.assertEqual([r.update_weight for r in results], [4.0, 7.0])
    np.testing.assert_allclose(after[0], initial.trainable[0] - ub[0], rtol=1e-6, atol=1e-7)
    for i in range(1, 6):
      np.testing.assert_allclose(
          after[i], initial.trainable[i] - (4 * ua[i] + 7 * ub[i]) / 11,
          rtol=1e-5, atol=1e-7)

  def test_client_update_of_frozen_variables_is_zero(self):
    client_work = masks.client_work.build_pvt_client_work(_model_fn, _sgd(0.5))
    weights = _initial_weights()
    mask = np.array([1, 0, 0, 1, 0, 1], np.float32)
    out = client_work.next(
        client_work.initialize(), [weights],
        [masks.client_input(_datasets(1)[0], mask)])
    result = out.result[0]
    for i, u in enumerate(result.update['update']):
      if mask[i]:
        self.assertGreater(np.abs(u).max(), 0.0)
      else:
        np.testing.assert_array_equal(u, np.zeros_like(u))
    np.testing.assert_array_equal(result.update['mask'], mask)
    self.assertEqual(result.update_weight, 4.0)

  def test_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, 'MaskedMeanFactory'):
      masks.build_pvt_process(_model_fn, client_optimizer_fn=_sgd(0.1),
                              model_aggregator=tff.aggregators.MeanFactory())
    with self.assertRaisesRegex(ValueError, 'client_optimizer_fn'):
      masks.build_pvt_process(_model_fn, client_optimizer_fn=0.1)


if __name__ == '__main__':
  tf.test.main()
