"""Tests of tff_partial/select/process.py (Algorithm 2 as a LearningProcess)."""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_partial.measure import comm
from tff_partial.select import keys as keys_lib
from tff_partial.select import process as process_lib
from tff_partial.select import slicing
from tests import select_test_utils as models


def _loss():
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _metrics():
  return [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')]


def _sgd(lr):
  return tff.learning.optimizers.build_sgdm(learning_rate=lr)


def _mlp_data(seed, n):
  rng = np.random.default_rng(seed)
  return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=rng.normal(size=(n, 7)).astype(np.float32),
      y=rng.integers(0, 3, size=(n, 1)).astype(np.int32))).batch(2)


def _token_data(seed, n, vocab, hot):
  """Sentences of 5 tokens drawn from `hot` words, next-token labels."""
  rng = np.random.default_rng(seed)
  x = rng.choice(hot, size=(n, 5)).astype(np.int32)
  y = rng.choice(hot, size=(n, 5)).astype(np.int32)
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(2)


def _numpy(weights):
  return tf.nest.map_structure(lambda v: np.asarray(v), weights)


class FedAvgEquivalenceTest(tf.test.TestCase):

  def test_all_keys_equals_tff_fed_avg(self):
    model = models.mlp()
    spec = slicing.make_select_spec(
        model, [slicing.GroupConfig(['dense1'], 6, structured=False)])
    input_spec = _mlp_data(0, 2).element_spec
    select = process_lib.build_federated_select_process(
        models.mlp, _loss, _metrics, input_spec, spec, _sgd(0.1), _sgd(1.0))
    fedavg = tff.learning.algorithms.build_weighted_fed_avg(
        lambda: tff.learning.models.from_keras_model(
            models.mlp(), loss=_loss(), input_spec=input_spec, metrics=_metrics()),
        client_optimizer_fn=_sgd(0.1), server_optimizer_fn=_sgd(1.0))
    # Same initial weights and data; clients select all 6 units (in order).
    init = _numpy(tff.learning.models.ModelWeights.from_model(models.randomize(models.mlp(), 5)))
    s_state = select.set_model_weights(select.initialize(), init)
    f_state = fedavg.set_model_weights(fedavg.initialize(), init)
    datasets = [_mlp_data(1, 4), _mlp_data(2, 6)]
    keys = keys_lib.all_keys(spec)
    for _ in range(2):
      s_out = select.next(s_state, [process_lib.client_input(d, keys) for d in datasets])
      f_out = fedavg.next(f_state, datasets)
      s_state, f_state = s_out.state, f_out.state
    s_weights = select.get_model_weights(s_state)
    f_weights = fedavg.get_model_weights(f_state)
    self.assertAllClose(s_weights.trainable, f_weights.trainable, atol=1e-6)
    self.assertNotAllClose(s_weights.trainable[0], init.trainable[0])
    self.assertEqual(s_out.metrics['client_work']['train']['num_examples'], 10)
    self.assertAllClose(s_out.metrics['client_work']['train']['loss'],
                        f_out.metrics['client_work']['train']['loss'], atol=1e-6)
    # Same state/metrics shape as FedAvg.
    self.assertEqual(list(s_out.metrics), list(f_out.metrics))

  def test_random_units_leave_unselected_units_unchanged(self):
    model = models.mlp()
    spec = slicing.make_select_spec(
        model, [slicing.GroupConfig(['dense1'], 2, structured=False)])
    input_spec = _mlp_data(0, 2).element_spec
    select, traffic_next = process_lib.build_federated_select_process_and_traffic(
        models.mlp, _loss, _metrics, input_spec, spec, _sgd(0.1), _sgd(1.0))
    init = _numpy(tff.learning.models.ModelWeights.from_model(models.randomize(models.mlp(), 5)))
    state = select.set_model_weights(select.initialize(), init)
    keys = [collections.OrderedDict(dense1=np.array(k, np.int32)) for k in ([0, 3], [3, 4])]
    out = select.next(state, [process_lib.client_input(_mlp_data(i, 4), k)
                              for i, k in enumerate(keys)])
    new = select.get_model_weights(out.state).trainable
    changed = [u for u in range(6) if not np.allclose(new[0][:, u], init.trainable[0][:, u])]
    self.assertEqual(changed, [0, 3, 4])
    unchanged_rows = [1, 2, 5]
    self.assertAllEqual(new[2][unchanged_rows], init.trainable[2][unchanged_rows])
    # Bytes: 2 units of (7 kernel + 1 bias + 4 next-kernel) down, + dense2
    # bias and dense3 broadcast; keys go up to select and with the update.
    # Measured on the federated_select form (what a deployed select sends);
    # the simulation (broadcast_gather, the default) broadcasts the whole
    # dense1 view (6 units) and the rest, and its uploads are the same.
    bytes_ = comm.client_bytes(traffic_next)
    held = 2 * (7 + 1 + 4) + 4 + 4 * 3 + 3
    self.assertEqual(slicing.client_params(spec), held)
    self.assertEqual(bytes_.down_payload, 4 * held)
    self.assertEqual(bytes_.up_payload, 4 * held + 2 * 4 * 2)
    simulated = comm.client_bytes(select.next)
    self.assertEqual(simulated.down_payload, 4 * (6 * (7 + 1 + 4) + 4 + 4 * 3 + 3))
    self.assertEqual(simulated.up_payload, bytes_.up_payload - 2 * 4)  # keys sent once

  def test_broadcast_gather_equals_federated_select(self):
    # Two select groups (mixed keys), two clients with different keys: both
    # implementations give every client the same slices, so the same round.
    vocab = 12
    model = models.word_model(vocab)
    spec = slicing.make_select_spec(model, slicing.group_configs(
        model, ['embedding', 'output', 'ffn1'], 6, 'mixed', oov_index=0))
    element_spec = _token_data(0, 2, vocab, [1]).element_spec
    init = _numpy(tff.learning.models.ModelWeights.from_model(
        models.randomize(models.word_model(vocab), 1)))
    policy = keys_lib.KeyPolicy(spec, 'mixed', seed=3)
    datasets = [_token_data(1, 6, vocab, [1, 2, 3, 4]),
                _token_data(2, 6, vocab, [3, 4, 5, 6, 7, 8, 9])]
    inputs = [process_lib.client_input(d, policy.client_keys(0, f'c{i}', d))
              for i, d in enumerate(datasets)]
    results = {}
    for implementation in (process_lib.FEDERATED_SELECT, process_lib.BROADCAST_GATHER):
      select = process_lib.build_federated_select_process(
          lambda: models.word_model(vocab), _loss, _metrics, element_spec, spec,
          _sgd(0.5), _sgd(1.0), implementation=implementation)
      state = select.set_model_weights(select.initialize(), init)
      out = select.next(state, inputs)
      results[implementation] = (select.get_model_weights(out.state).trainable,
                                 out.metrics['client_work']['train']['loss'])
    (w_select, loss_select), (w_gather, loss_gather) = results.values()
    self.assertNotAllClose(w_select[0], init.trainable[0])
    for a, b in zip(w_select, w_gather):
      self.assertAllEqual(a, b)
    self.assertEqual(loss_select, loss_gather)

  def test_output_keys_missing_a_batch_drop_it_and_train_on_the_rest(self):
    # Random output keys can miss every class of a batch: its examples are
    # dropped and the empty batch must go too (oneDNN's conv rejects it).
    model = models.cnn()
    spec = slicing.make_select_spec(model, slicing.group_configs(model, ['out'], 2, 'random'))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 6, 6, 1)).astype(np.float32)
    data = [tf.data.Dataset.from_tensor_slices((x, np.array(labels, np.int32))).batch(2)
            for labels in ([0, 0, 2, 1, 1, 1], [0, 0, 0, 0, 0, 0])]
    keys = collections.OrderedDict(out=np.array([1, 2], np.int32))
    remapped = [list(slicing.client_dataset(spec, keys, d).as_numpy_iterator()) for d in data]
    self.assertEqual([[y.tolist() for _, y in batches] for batches in remapped],
                     [[[1, 0], [0, 0]], []])  # classes 1, 2 -> the client's 0, 1
    self.assertAllEqual(remapped[0][0][0], x[2:4])
    select = process_lib.build_federated_select_process(
        models.cnn, _loss, _metrics, data[0].element_spec, spec, _sgd(0.1), _sgd(1.0))
    init = _numpy(tff.learning.models.ModelWeights.from_model(models.randomize(models.cnn(), 2)))
    state = select.set_model_weights(select.initialize(), init)
    out = select.next(state, [process_lib.client_input(d, keys) for d in data])
    self.assertEqual(out.metrics['client_work']['train']['num_examples'], 4)
    new = select.get_model_weights(out.state).trainable
    self.assertTrue(all(np.all(np.isfinite(v)) for v in new))
    self.assertAllEqual(new[-1][0], init.trainable[-1][0])  # class 0: no keys
    self.assertNotAllClose(new[-1][1:], init.trainable[-1][1:])

  def test_bad_implementation(self):
    with self.assertRaisesRegex(ValueError, 'select_implementation.*valid values: auto'):
      process_lib.resolve_implementation('gather', None)


class StructuredStandInsTest(tf.test.TestCase):
  """Stand-ins of shakespeare_word / stackoverflow_nwp (not on main yet)."""

  def test_word_model_mixed_keys(self):
    vocab = 12
    model = models.word_model(vocab)
    spec = slicing.make_select_spec(model, slicing.group_configs(
        model, ['embedding', 'output', 'ffn1'], 6, 'mixed', oov_index=0))
    self.assertEqual([g.keys_per_client for g in spec.groups], [6, 3])
    element_spec = _token_data(0, 2, vocab, [1]).element_spec
    select = process_lib.build_federated_select_process(
        lambda: models.word_model(vocab), _loss, _metrics, element_spec, spec,
        _sgd(0.5), _sgd(1.0))
    init = _numpy(tff.learning.models.ModelWeights.from_model(models.randomize(models.word_model(vocab), 1)))
    state = select.set_model_weights(select.initialize(), init)
    policy = keys_lib.KeyPolicy(spec, 'mixed', seed=3)
    datasets = [_token_data(1, 6, vocab, [1, 2, 3, 4]), _token_data(2, 6, vocab, [3, 4, 5, 6, 7, 8, 9])]
    inputs = [process_lib.client_input(d, policy.client_keys(0, f'c{i}', d))
              for i, d in enumerate(datasets)]
    vocab_keys = set()
    for value in inputs:
      vocab_keys |= set(value['keys']['embedding'].tolist())
    self.assertIn(0, vocab_keys)  # the OOV word is always selected
    self.assertTrue({1, 2, 3, 4} <= vocab_keys)
    out = select.next(state, inputs)
    self.assertGreater(out.metrics['client_work']['train']['num_examples'], 0)
    new = select.get_model_weights(out.state).trainable
    emb_new, emb_old = new[0], init.trainable[0]
    for word in range(vocab):
      moved = not np.allclose(emb_new[word], emb_old[word])
      if word not in vocab_keys:
        self.assertFalse(moved, f'unselected word {word} moved')
    # Output units of unselected words are unchanged too.
    unselected = [w for w in range(vocab) if w not in vocab_keys]
    self.assertAllEqual(new[5][:, unselected], init.trainable[5][:, unselected])

  def test_bag_of_words_top_keys(self):
    model = models.bag_of_words(n=12, tags=5)
    spec = slicing.make_select_spec(
        model, slicing.group_configs(model, ['dense'], 4, 'top'))
    rng = np.random.default_rng(0)
    x = np.zeros((6, 12), np.float32)
    x[:, [1, 5, 6, 9]] = rng.integers(0, 2, size=(6, 4))
    x[:, 1] = 1
    y = rng.integers(0, 2, size=(6, 5)).astype(np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(3)
    select = process_lib.build_federated_select_process(
        lambda: models.bag_of_words(12, 5), tf.keras.losses.BinaryCrossentropy,
        lambda: [tf.keras.metrics.Recall(name='recall')], ds.element_spec, spec,
        _sgd(0.5), _sgd(1.0))
    init = _numpy(tff.learning.models.ModelWeights.from_model(models.randomize(models.bag_of_words(12, 5))))
    state = select.set_model_weights(select.initialize(), init)
    keys = keys_lib.KeyPolicy(spec, 'top').client_keys(0, 'a', ds)
    self.assertTrue({1, 5, 6, 9} >= set(keys['dense'].tolist()) - {0})
    out = select.next(state, [process_lib.client_input(ds, keys)])
    new = select.get_model_weights(out.state).trainable
    for row in range(12):
      if row not in keys['dense']:
        self.assertAllEqual(new[0][row], init.trainable[0][row])


if __name__ == '__main__':
  tf.test.main()
