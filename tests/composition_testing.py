"""The composition matrix: every method x every aggregator vs a numpy reference.

Shared by `tests/composition_*_test.py` (split by method so that
`pytest -n 2 --dist loadfile` runs them in parallel).

How a case runs. A tiny task (bag of 8 count features -> dense1 (6) ->
dense2 (4) -> dense3 (5 classes); 3 clients of 2, 3 and 5 examples, so a
weighted mean differs from a uniform one) is built through the training
binary's own path: `scripts.train.validate_training_flags()` and
`scripts.train.build(task)` under the flags of the case (noise 0 and a clip of
1e6 that never binds for the DP aggregators; server SGD with learning rate 1,
so the server update is exactly the aggregate). For each of 2 rounds:

1. the round's client values come from the loop's own selection function
   (`loop.build_client_selection_fn` with the case's `client_indices_fn`), so
   masks (PVT) and keys (select) are those the case trains with;
2. each client's own update `u_c` is measured by running the same method with
   `--aggregator=mean` on that client alone from the same model: the mean of
   one client is its update (PVT: zero where it froze a variable; select: its
   deselected update, zero at keys it did not choose);
3. the case's process runs the round on all clients, and its server update
   (weights before minus after) is compared with the numpy reference of the
   aggregator applied to the `u_c`:
   * `mean`: weighted mean (weights = examples); PVT: per variable over the
     clients that trained it; select: per key over the clients that chose it;
   * `dp_gaussian`, `dp_ftrl` (noise 0): uniform mean with the fixed
     denominator clients_per_round; PVT: per-variable sum over trainers divided
     by their count; select: the paper's eq. (5), (1/N) sum_n phi(u_n, z_n);
   * `median`: coordinate-wise median over the clients; PVT: over the clients
     that trained the variable; select: over the clients that chose the key
     (broadcast variables: over all clients).
"""

import collections
import time

from absl import flags
from absl.testing import flagsaver
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import registry

AGGREGATORS = ('mean', 'median', 'dp_gaussian', 'dp_ftrl')
DP = ('dp_gaussian', 'dp_ftrl')
ROUNDS = 2
NUM_FEATURES = 8
NUM_CLASSES = 5
EXAMPLES = (2, 3, 5)
CLIENT_LR = 0.5
# Each case's flags besides the method's: noise 0 and a clip that never binds.
_DP_FLAGS = dict(noise_multiplier=0.0, clip_norm=1e6)


def keras_model():
  return tf.keras.Sequential([
      tf.keras.layers.Input(shape=(NUM_FEATURES,)),
      tf.keras.layers.Dense(6, activation='relu', name='dense1'),
      tf.keras.layers.Dense(4, activation='relu', name='dense2'),
      tf.keras.layers.Dense(NUM_CLASSES, name='dense3'),
  ], name='tiny')


def _client_examples(index, n):
  rng = np.random.default_rng(100 + index)
  # Counts of 8 "words", each client favouring its own (top keys differ).
  x = rng.poisson(0.5, size=(n, NUM_FEATURES)).astype(np.float32)
  x[:, (2 * index) % NUM_FEATURES] += 2.0
  x[:, (2 * index + 1) % NUM_FEATURES] += 1.0
  y = rng.integers(0, NUM_CLASSES, size=n).astype(np.int32)
  return collections.OrderedDict(x=x, y=y)


def tiny_task() -> registry.Task:
  """3 clients of 2, 3, 5 examples; each client's data is one batch."""
  data = tff.simulation.datasets.TestClientData(
      {f'c{i}': _client_examples(i, n) for i, n in enumerate(EXAMPLES)})

  def preprocess(dataset):
    return dataset.map(lambda e: (e['x'], e['y'])).batch(8)

  def loss_fn():
    return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  def metrics_fn():
    return [tf.keras.metrics.SparseCategoricalAccuracy()]

  baseline = registry.make_baseline_task(
      train_data=data, test_data=data, train_preprocess_fn=preprocess,
      eval_preprocess_fn=preprocess, keras_model_fn=keras_model,
      loss_fn=loss_fn, metrics_fn=metrics_fn)
  return registry.Task(
      name='tiny', baseline=baseline, keras_model_fn=keras_model,
      loss_fn=loss_fn, metrics_fn=metrics_fn, data_source='synthetic',
      data_description='3 synthetic clients (composition tests)')


# Methods of the matrix: name -> the method flags of scripts.train.
METHODS = collections.OrderedDict([
    ('fedavg', dict(algorithm='fedavg')),
    ('fedpt', dict(algorithm='fedpt', frozen_layers=['dense2'])),
    ('pvt_fixed', dict(algorithm='pvt', pvt_scheme='fixed', pvt_freeze_fraction=0.5)),
    ('pvt_per_round', dict(algorithm='pvt', pvt_scheme='per_round',
                           pvt_freeze_fraction=0.5)),
    ('pvt_per_client_per_round', dict(algorithm='pvt', pvt_scheme='per_client_per_round',
                                      pvt_freeze_fraction=0.5)),
    # dense1 reads the input: structured keys (4 of the 8 features).
    ('select_top', dict(algorithm='select', select_layer=['dense1'], select_keys=4,
                        select_policy='top')),
    ('select_random_top', dict(algorithm='select', select_layer=['dense1'], select_keys=3,
                               select_policy='random_top')),
    # dense2 is an inner layer: random keys (2 of its 4 units).
    ('select_random', dict(algorithm='select', select_layer=['dense2'], select_keys=2,
                           select_policy='random')),
    ('select_mixed', dict(algorithm='select', select_layer=['dense1', 'dense2'],
                          select_keys=4, select_policy='mixed')),
])


def case_flags(method, aggregator: str) -> dict:
  """Flags of a case; `method` names a METHODS entry or is a dict of method flags."""
  method_flags = METHODS[method] if isinstance(method, str) else method
  values = dict(method_flags, aggregator=aggregator, clients_per_round=len(EXAMPLES),
                total_rounds=ROUNDS, client_optimizer='sgd', client_learning_rate=CLIENT_LR,
                server_optimizer='sgd', server_learning_rate=1.0, seed=3,
                client_loop='iterator')
  if aggregator in DP:
    values.update(_DP_FLAGS)
  return values


def build(task, method_name, aggregator: str):
  """(BuiltMethod, AggregatorChoice) through scripts.train, or FlagError.

  `method_name`: a METHODS entry, or a dict of method flags.
  """
  from scripts import train  # pylint: disable=g-import-not-at-top
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  with flagsaver.flagsaver(**case_flags(method_name, aggregator)):
    train.validate_training_flags()
    return train.build(task)


def _flat(weights):
  return [np.asarray(w, np.float64) for w in weights.trainable]


def _run_round(process, state, values):
  out = process.next(state, values)
  return out.state


def client_updates(mean_built, weights, values):
  """Each client's update from `weights`, run alone through the mean process."""
  process = mean_built.process
  start = process.set_model_weights(process.initialize(), weights)
  before = _flat(weights)
  updates = []
  for value in values:
    after = _flat(process.get_model_weights(_run_round(process, start, [value])))
    updates.append([b - a for b, a in zip(before, after)])
  return updates


def _median(stack):
  return np.median(np.stack(stack), axis=0) if stack else None


def reference(kind, aggregator, updates, weights, info):
  """The numpy aggregate of `updates` (one list of arrays per client).

  kind: 'dense' (fedavg/fedpt), 'pvt' or 'select'. info: per client, the PVT
  mask (bool per variable) or the select trained-coordinate indicators (one
  bool array per variable: where the client's deselected update lives).
  """
  n = len(updates)
  w = np.asarray(weights, np.float64)
  out = []
  for v in range(len(updates[0])):
    stack = np.stack([u[v] for u in updates])
    if kind == 'dense':
      present = np.ones(stack.shape, bool)
    elif kind == 'pvt':
      present = np.stack([np.full(stack.shape[1:], bool(info[c][v])) for c in range(n)])
    else:
      present = np.stack([info[c][v] for c in range(n)])
    if aggregator == 'mean':
      ww = w.reshape([-1] + [1] * (stack.ndim - 1)) * present
      den = ww.sum(0)
      out.append(np.where(den > 0, (ww * stack).sum(0) / np.where(den > 0, den, 1), 0.0))
    elif aggregator in DP:
      if kind == 'pvt':  # per-variable sum over trainers / their public count
        count = present.sum(0)
        out.append(np.where(count > 0, (stack * present).sum(0) / np.maximum(count, 1), 0.))
      else:  # fixed denominator (select: eq. 5 over all N clients)
        out.append(stack.sum(0) / n)
    else:  # median over the clients that hold the coordinate
      masked = np.where(present, stack, np.nan)
      with np.errstate(all='ignore'):
        import warnings  # pylint: disable=g-import-not-at-top
        with warnings.catch_warnings():
          warnings.simplefilter('ignore', RuntimeWarning)
          med = np.nanmedian(masked, axis=0)
      out.append(np.where(present.any(0), med, 0.0))
  return out


def select_presence(task, method_name, values, updates):
  """Per client and variable: the coordinates its keys select (bool arrays)."""
  from scripts.methods import select  # pylint: disable=g-import-not-at-top
  m = METHODS[method_name]
  spec = select.select_spec(task, m['select_layer'], m['select_keys'], m['select_policy'])
  out = []
  for value, update in zip(values, updates):
    present = [np.ones(u.shape, bool) for u in update]
    for g in spec.groups:
      keys = np.asarray(value['keys'][g.name])
      for s in g.slices:
        view = np.zeros(s.view_shape, bool)
        index = [slice(None)] * len(s.view_shape)
        chosen = np.concatenate([np.arange(k * g.bucket_size, (k + 1) * g.bucket_size)
                                 for k in keys])
        index[s.axis] = chosen
        view[tuple(index)] = True
        present[s.index] = view.reshape(s.shape)
    out.append(present)
  return out


def method_kind(method_name):
  if method_name.startswith('pvt'):
    return 'pvt'
  if method_name.startswith('select'):
    return 'select'
  return 'dense'


def run_case(test_case, task, method_name, aggregator, mean_built=None, atol=2e-6):
  """Builds the case, runs 2 rounds, asserts the server update = reference.

  Returns (seconds, [per-round (server update, reference)]).
  """
  from tff_partial.training import loop  # pylint: disable=g-import-not-at-top
  start = time.time()
  built, choice = build(task, method_name, aggregator)
  if mean_built is None:
    mean_built = built if aggregator == 'mean' else build(task, method_name, 'mean')[0]
  select_fn = loop.build_client_selection_fn(
      task, built, len(EXAMPLES), 3, choice.client_indices_fn)
  process = built.process
  state = process.set_model_weights(process.initialize(),
                                    loop.initial_model_weights(task, 3))
  kind = method_kind(method_name)
  results = []
  for round_num in range(1, ROUNDS + 1):
    values = select_fn(round_num)
    weights = process.get_model_weights(state)
    updates = client_updates(mean_built, weights, values)
    counts = [sum(int(tf.shape(b[1])[0]) for b in _data(value)) for value in values]
    if kind == 'pvt':
      info = [np.asarray(next(iter(v['mask']))).astype(bool) for v in values]
    elif kind == 'select':
      info = select_presence(task, method_name, values, updates)
    else:
      info = None
    expected = reference(kind, aggregator, updates, counts, info)
    state = _run_round(process, state, values)
    got = [b - a for b, a in zip(_flat(weights), _flat(process.get_model_weights(state)))]
    for v, (g, e) in enumerate(zip(got, expected)):
      test_case.assertAllClose(
          g, e, atol=atol, rtol=1e-5,
          msg=f'{method_name} x {aggregator}, round {round_num}, variable {v}')
    results.append((got, expected))
  return time.time() - start, results


def _data(value):
  dataset = value['data'] if isinstance(value, dict) else value
  return list(dataset)


# Combinations refused by design at flag validation, and why (docs/privacy.md).
REFUSED = {
    (m, a): 'keys chosen from a client\'s data'
    for m in ('select_top', 'select_random_top', 'select_mixed') for a in DP
}


class MatrixTestCase(tf.test.TestCase):
  """Runs every aggregator of a method against the numpy reference."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()
    cls.task = tiny_task()

  def check_method(self, method_name):
    from scripts import flag_groups  # pylint: disable=g-import-not-at-top
    mean_built = None
    for aggregator in AGGREGATORS:
      with self.subTest(method=method_name, aggregator=aggregator):
        if (method_name, aggregator) in REFUSED:
          with self.assertRaises(flag_groups.FlagError) as raised:
            build(self.task, method_name, aggregator)
          message = str(raised.exception)
          self.assertIn(REFUSED[(method_name, aggregator)], message)
          self.assertNotIn('\n', message)
          continue
        if mean_built is None:
          mean_built = build(self.task, method_name, 'mean')[0]
        seconds, results = run_case(self, self.task, method_name, aggregator, mean_built)
        # The reference is not trivially zero: the clients moved the model.
        self.assertGreater(max(np.abs(e).max() for _, exp in results for e in exp), 1e-3)
        print(f'{method_name} x {aggregator}: {seconds:.1f}s')
