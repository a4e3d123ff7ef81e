r"""Benchmarks methods side by side, on the same clients and seeds.

  python -m scripts.benchmark --task=emnist_cnn_gn --data_source=leaf \
      --data_dir=../shared/data/femnist_leaf_sample.tar.xz \
      --clients_per_round=10 --benchmark_rounds=6 --output_dir=/tmp/bench

For one task and cohort this runs, in one process and on the same sampled
clients per round:

* `tff_fedavg`: TFF's own `tff.learning.algorithms.build_weighted_fed_avg`
  fed by TFF's own client data path (`create_tf_dataset_for_client` +
  the baseline task's preprocessing);
* `fedavg`: this package's FedAvg (`scripts/methods/fedavg.py` `build(ctx)`)
  fed by the training loop's per-round client data path (seeded shuffle per
  (seed, round, client), preprocessing, the method's `client_input_fn`);
* FedPT, PVT and federated select configurations: a configuration is
  (name, algorithm, flag overrides); it is built with its method module's
  `build(ctx)` under `flagsaver` with the overrides. A method whose module
  still says "not implemented" is skipped with a note.

and reports for each: median seconds per round after warm-up, client training
seconds, examples per second, exact bytes down/up per client, client peak
extra training memory and accuracy after the rounds; plus the throughput of
centralized Keras training (`model.fit` on the same examples and batch size).
Ratios are given relative to TFF FedAvg and to centralized Keras. Writes
`benchmark.json` and `benchmark.md` into --output_dir.

What is measured (also written into the Markdown):
* round seconds: wall time of one `process.next` call including building the
  cohort's client datasets (both are part of a round); median over the rounds
  after --benchmark_warmup_rounds.
* client training seconds: seconds of `process.next` (data building excluded)
  minus the median seconds of `process.next` for the same round (same state,
  same cohort size, same client input path) on clients whose datasets are
  empty. What remains is the clients' local training (data
  pipeline + forward/backward/optimizer); what is subtracted is broadcast,
  aggregation, server update and the runtime's dispatch.
* examples per second: examples the cohort trains on per round / round
  seconds; `client ex/s` divides by client training seconds instead.
* client extra training memory: `tff_partial.measure.memory` (PVT, Table 2):
  the TensorFlow allocator peak of one training step on one batch that
  differentiates only the variables a client trains
  (`BuiltMethod.client_trained_mask_fn`), minus the peak of a forward-only
  step, each in a fresh subprocess; mean and max over the first
  --benchmark_memory_clients clients of round 0 (PVT draws a mask per client).
  Federated select clients train a sliced sub-model: not measured.

`--benchmark_select_buckets=1,10,50,100` instead times one round of
`tff.federated_select` (each client selects --benchmark_select_keys rows, in
keys of B rows) against a broadcast of the same payload
(`tff_partial.select.bench`).

`--benchmark_cohorts=10,50,100,200` instead reports seconds per round against
clients per round for each configuration, with a least-squares line and R^2 to
show whether the cost grows linearly.
"""

import collections
import contextlib
import dataclasses
import json
import os
import re
import statistics
import sys
import time
from typing import Any, Optional

from absl import app
from absl import flags
from absl import logging
from absl.testing import flagsaver
import numpy as np
import psutil
import tensorflow as tf
import tensorflow_federated as tff

from scripts import flag_groups
from scripts import runtime_flags
from scripts.methods import aggregators
from scripts.methods import fedavg
from scripts.methods import fedpt
from scripts.methods import pvt
from scripts.methods import select
from tff_partial import runtime
from tff_partial.measure import memory
from tff_partial.select import bench as select_bench
from tff_partial.training import loop
from tff_partial.training import method

_METHOD_MODULES = {'fedavg': fedavg, 'fedpt': fedpt, 'pvt': pvt, 'select': select}

# (name, algorithm, flag overrides). `tff_fedavg` is TFF's own FedAvg and data
# path; every other algorithm is built through scripts/methods/<algorithm>.py.
PRESETS = collections.OrderedDict(
    (c[0], c) for c in [
        # TFF's FedAvg as a user calls it (its default loop, dataset.reduce) ...
        ('tff_fedavg', 'tff_fedavg', {}),
        # ... and with TFF's iterator loop, this package's default (--client_loop).
        ('tff_fedavg_iterator', 'tff_fedavg', {'client_loop': 'iterator'}),
        ('fedavg', 'fedavg', {}),
        # This package's FedAvg with TFF's default loop.
        ('fedavg_reduce', 'fedavg', {'client_loop': 'reduce'}),
        # FedPT: freeze the big dense layer (FedPT appendix, EMNIST CNN) ...
        ('fedpt_dense1', 'fedpt', {'frozen_layers': 'dense1'}),
        # ... or every convolution (normalization layers always train, as in
        # FedPT): no kernel gradient of any convolution is formed ...
        ('fedpt_convs', 'fedpt', {'frozen_regex': '.*conv.*'}),
        # ... or the largest layers until 10% stays trainable (ResNet-18: the
        # residual convolutions, as in FedPT's CIFAR-10 setting).
        ('fedpt_most', 'fedpt', {'frozen_target_trainable_fraction': 0.1}),
        ('pvt_fixed_0.5', 'pvt', {'pvt_scheme': 'fixed', 'pvt_freeze_fraction': 0.5}),
        ('pvt_per_client_0.5', 'pvt',
         {'pvt_scheme': 'per_client_per_round', 'pvt_freeze_fraction': 0.5}),
        ('select_conv2_random', 'select',
         {'select_layer': 'conv2', 'select_keys': 16, 'select_policy': 'random'}),
    ])

# Presets per task (the ones that make sense for its model).
TASK_PRESETS = {
    'emnist_cnn_gn': ('tff_fedavg', 'tff_fedavg_iterator', 'fedavg', 'fedpt_dense1',
                      'fedpt_convs', 'pvt_fixed_0.5', 'pvt_per_client_0.5',
                      'select_conv2_random'),
    'emnist_cnn': ('tff_fedavg', 'tff_fedavg_iterator', 'fedavg', 'fedpt_dense1',
                   'pvt_fixed_0.5', 'select_conv2_random'),
    'cifar10_resnet18': ('tff_fedavg', 'tff_fedavg_iterator', 'fedavg', 'fedpt_most',
                         'fedpt_convs', 'pvt_fixed_0.5', 'pvt_per_client_0.5'),
}
_DEFAULT_PRESETS = ('tff_fedavg', 'tff_fedavg_iterator', 'fedavg', 'pvt_fixed_0.5')

_CONFIGS = flags.DEFINE_list(
    'benchmark_configs', None,
    'Preset configurations to run; default: the presets of --task. Presets: '
    + ', '.join(PRESETS))
_CUSTOM = flags.DEFINE_multi_string(
    'benchmark_config', [],
    'Extra configuration NAME:ALGORITHM:FLAG=VALUE;FLAG=VALUE (e.g. '
    '"fedpt_conv:fedpt:frozen_layers=conv1,conv2"); repeatable.')
_ROUNDS = flags.DEFINE_integer(
    'benchmark_rounds', 5, 'Rounds per configuration, warm-up included.')
_WARMUP = flags.DEFINE_integer(
    'benchmark_warmup_rounds', 1, 'Rounds not timed (tracing, compilation, caches).')
_EMPTY_ROUNDS = flags.DEFINE_integer(
    'benchmark_empty_rounds', 2,
    'Rounds on empty client datasets per configuration (to isolate client training time).')
_COHORTS = flags.DEFINE_list(
    'benchmark_cohorts', None,
    'Clients per round to sweep (scaling mode), e.g. 10,50,100,200; a cohort '
    'larger than the population samples clients with replacement.')
_LOCAL_WORKERS = flags.DEFINE_integer(
    'benchmark_local_workers', 0,
    'Scaling mode: start this many TFF workers on loopback for the sweep '
    '(instead of --workers; --worker_max_clients_per_subround applies) and '
    'report each worker\'s peak resident memory (VmHWM) per cohort.')
_KERAS = flags.DEFINE_bool(
    'benchmark_keras', True, 'Also measure centralized Keras model.fit throughput.')
_MEMORY = flags.DEFINE_bool(
    'benchmark_memory', True,
    'Measure client extra training memory (tff_partial.measure.memory).')
_MEMORY_CLIENTS = flags.DEFINE_integer(
    'benchmark_memory_clients', 4,
    'Clients of the first round whose masks are measured (PVT draws one per client).')
_EVAL = flags.DEFINE_bool('benchmark_eval', True, 'Evaluate accuracy after the rounds.')
_SELECT_BUCKETS = flags.DEFINE_list(
    'benchmark_select_buckets', None,
    'Select-vs-broadcast mode (no task needed): rows per select key to time, '
    'e.g. 1,10,50,100; each is one round of tff.federated_select of '
    '--benchmark_select_keys rows per client against a broadcast of the same payload.')
_SELECT_KEYS = flags.DEFINE_integer(
    'benchmark_select_keys', 1000, 'Select-vs-broadcast: rows each client needs.')
_SELECT_CLIENTS = flags.DEFINE_integer(
    'benchmark_select_clients', 50, 'Select-vs-broadcast: clients per round.')
_SELECT_ROW_DIM = flags.DEFINE_integer(
    'benchmark_select_row_dim', 96, 'Select-vs-broadcast: floats per row.')


class Skip(Exception):
  """A configuration cannot run (method not implemented, flags not defined)."""


@dataclasses.dataclass
class Config:
  name: str
  algorithm: str
  overrides: dict


def parse_custom(spec: str) -> Config:
  parts = spec.split(':', 2)
  if len(parts) < 2 or not parts[0] or not parts[1]:
    raise flag_groups.FlagError(
        f'--benchmark_config={spec!r}: expected NAME:ALGORITHM[:FLAG=VALUE;...]')
  name, algorithm = parts[0], parts[1]
  if algorithm not in ('tff_fedavg', *_METHOD_MODULES):
    raise flag_groups.FlagError(
        f'--benchmark_config={spec!r}: algorithm {algorithm!r}; valid values: '
        + ', '.join(('tff_fedavg', *_METHOD_MODULES)))
  overrides = {}
  if len(parts) == 3 and parts[2]:
    for item in parts[2].split(';'):
      key, sep, value = item.partition('=')
      if not sep:
        raise flag_groups.FlagError(
            f'--benchmark_config={spec!r}: {item!r} is not FLAG=VALUE')
      overrides[key.strip()] = value.strip()
  return Config(name, algorithm, overrides)


def selected_configs(task_name: str) -> list[Config]:
  names = _CONFIGS.value
  if names is None:
    names = TASK_PRESETS.get(task_name, _DEFAULT_PRESETS)
  configs = []
  for name in names:
    if name not in PRESETS:
      raise flag_groups.FlagError(
          f'--benchmark_configs: unknown preset {name!r}; valid values: '
          + ', '.join(PRESETS))
    configs.append(Config(*PRESETS[name]))
  configs += [parse_custom(s) for s in _CUSTOM.value]
  seen = set()
  for c in configs:
    if c.name in seen:
      raise flag_groups.FlagError(f'configuration name {c.name!r} given twice')
    seen.add(c.name)
  return configs


def _flag_overrides(config: Config) -> dict:
  """Parses override strings with each flag's own parser."""
  parsed = {}
  for key, value in config.overrides.items():
    if key not in flags.FLAGS:
      raise Skip(f'flag --{key} is not defined (is {config.algorithm} on main yet?)')
    if isinstance(value, str):
      flag = flags.FLAGS[key]
      try:
        value = flag.parser.parse(value)
      except (ValueError, TypeError) as e:
        raise flag_groups.FlagError(f'{config.name}: --{key}={value!r}: {e}') from e
    parsed[key] = value
  return parsed


_NOT_IMPLEMENTED = re.compile('not implemented', re.IGNORECASE)


def _build_tff_fedavg(ctx: method.MethodContext, loop) -> method.BuiltMethod:
  """TFF's `build_weighted_fed_avg` with its default aggregator and `loop`.

  The same builder as this package's FedAvg method (`scripts/methods/fedavg.py`);
  what makes it "TFF's" is the client data path (`client_inputs`).
  """
  built = fedavg.build(dataclasses.replace(
      ctx, model_aggregator=None, loop_implementation=loop))
  return dataclasses.replace(built, name='tff_fedavg')


def build_config(config: Config, ctx: method.MethodContext) -> method.BuiltMethod:
  """Builds one configuration; raises Skip for methods not implemented yet.

  The configuration's flag overrides hold while it is built, including
  --client_loop. `tff_fedavg` is TFF's FedAvg as a user calls it, with TFF's
  default loop (dataset.reduce) unless the configuration sets --client_loop.
  """
  overrides = _flag_overrides(config)
  try:
    with flagsaver.flagsaver(**overrides):
      if config.algorithm == 'tff_fedavg':
        loop = (flag_groups.loop_implementation() if 'client_loop' in overrides
                else tff.learning.LoopImplementation.DATASET_REDUCE)
        return _build_tff_fedavg(ctx, loop)
      module = _METHOD_MODULES[config.algorithm]
      module.validate_flags()
      return module.build(dataclasses.replace(
          ctx, loop_implementation=flag_groups.loop_implementation()))
  except NotImplementedError as e:
    raise Skip(f'{config.algorithm} is not implemented yet ({e})') from e
  except flag_groups.FlagError as e:
    if _NOT_IMPLEMENTED.search(str(e)):
      raise Skip(str(e)) from e
    raise


# ----------------------------------------------------------------------------
# Client data paths.
def sample_cohort(client_ids, seed: int, round_num: int, size: int) -> list[str]:
  """Clients of a round, as the training loop samples them (same for every config).

  A cohort larger than the population (scaling sweeps) samples with replacement.
  """
  sample = tff.simulation.build_uniform_sampling_fn(
      client_ids, replace=size > len(client_ids), random_seed=seed)
  return list(sample(round_num, size))


def tff_client_data(task, cohort, round_num, seed):
  """TFF's own path: the baseline task's preprocessing of each client."""
  del round_num, seed
  data = task.baseline.datasets
  return [data.train_preprocess_fn(data.train_data.create_tf_dataset_for_client(c))
          for c in cohort]


_selection_fns: dict = {}


def package_client_data(task, built, cohort, round_num, seed, empty=False):
  """The training loop's per-round path: seeded shuffle, preprocess, client_input_fn.

  When the cohort is the loop's own sample, this calls the loop's
  `build_client_selection_fn` itself; otherwise (empty datasets, cohorts
  sampled with replacement) it repeats the same steps on `cohort`.
  """
  data = task.baseline.datasets
  if not empty and len(cohort) <= task.population:
    key = (id(built), len(cohort), seed)
    if key not in _selection_fns:
      _selection_fns[key] = loop.build_client_selection_fn(task, built, len(cohort), seed)
    return _selection_fns[key](round_num)
  values = []
  for index, client_id in enumerate(cohort):
    raw = data.train_data.create_tf_dataset_for_client(client_id)
    if empty:
      raw = raw.take(0)
    raw = raw.shuffle(loop._SHUFFLE_BUFFER,  # pylint: disable=protected-access
                      seed=loop.client_seed(seed, round_num, index),
                      reshuffle_each_iteration=True)
    dataset = data.train_preprocess_fn(raw)
    if built.client_input_fn is not None:
      dataset = built.client_input_fn(round_num, index, client_id, dataset)
    values.append(dataset)
  return values


def client_inputs(config, task, built, cohort, round_num, seed, empty=False):
  if config.algorithm == 'tff_fedavg':
    values = tff_client_data(task, cohort, round_num, seed)
    return [v.take(0) for v in values] if empty else values
  return package_client_data(task, built, cohort, round_num, seed, empty=empty)


_example_counts: dict = {}


def count_examples(task, client_id) -> int:
  """Examples one client trains on per round (epochs and max batches applied)."""
  if client_id not in _example_counts:
    data = task.baseline.datasets
    dataset = data.train_preprocess_fn(data.train_data.create_tf_dataset_for_client(client_id))
    total = 0
    for batch in dataset:
      total += int(tf.shape(tf.nest.flatten(batch)[0])[0])
    _example_counts[client_id] = total
  return _example_counts[client_id]


# ----------------------------------------------------------------------------
# Measurements.
def cpu_seconds() -> float:
  """User + system CPU seconds of this process and its live descendants.

  The descendants include TFF's local C++ worker (and workers started by
  `runtime.local_workers`), where the rounds run. CPU time is far less
  sensitive than wall time to other load on a shared machine, so the CPU
  ratios are the steadier ones there (TF's thread pools spin briefly before
  sleeping, which counts as CPU time alike for every configuration).
  Workers started outside this process (`--workers`) are not counted.
  """
  me = psutil.Process()
  total = 0.0
  for proc in [me, *me.children(recursive=True)]:
    try:
      times = proc.cpu_times()
    except psutil.Error:  # exited meanwhile
      continue
    total += times.user + times.system
  return total


class ClientMemory:
  """Client extra training memory (PVT's Table 2), via `tff_partial.measure.memory`.

  For a configuration, each of the first `num_clients` clients of the first
  round trains the variables `BuiltMethod.client_trained_mask_fn` names (all
  of them when it is None); its extra memory is the TensorFlow allocator peak
  of one training step on one batch that differentiates only those variables,
  minus the peak of a forward-only step, each in a fresh subprocess. Peaks are
  cached per mask, so configurations that train the same variables (TFF
  FedAvg, FedAvg) share one measurement.
  """

  def __init__(self, task, batch_size: int, seed: int, num_clients: int):
    self.task, self.batch_size, self.seed = task, batch_size, seed
    self.num_clients = num_clients
    x_spec, y_spec = task.baseline.datasets.element_type_structure
    self.kwargs = dict(
        input_dtype=x_spec.dtype.name, label_shape=tuple(y_spec.shape[1:]),
        num_classes=self._num_classes(), seed=seed)
    self.input_shape = tuple(x_spec.shape[1:])
    self._forward = None
    self._train = {}

  def _num_classes(self) -> int:
    with tf.Graph().as_default():  # a throwaway model
      return int(self.task.keras_model_fn().output_shape[-1])

  def _peak(self, mode, mask=None) -> int:
    return memory.measure_step_peak(
        self.task.keras_model_fn, self.task.loss_fn, self.input_shape,
        self.batch_size, mode=mode, trainable_mask=mask, **self.kwargs)['peak']

  def measure(self, built) -> dict:
    """{client_extra_memory_bytes (mean), ..._max, memory_note}."""
    if not built.client_model_is_task_model:
      return {'memory_note': 'not measured: a client trains a sliced sub-model, '
                             'not the task model'}
    if built.client_trained_mask_fn is None:
      masks = [None]
    else:
      masks = [tuple(built.client_trained_mask_fn(0, i)) for i in range(self.num_clients)]
    try:
      if self._forward is None:
        self._forward = self._peak('forward')
      extras = []
      for mask in masks:
        if mask not in self._train:
          self._train[mask] = self._peak('train', mask)
        extras.append(self._train[mask] - self._forward)
    except ValueError as e:  # e.g. a keras_model_fn that cannot be pickled
      return {'memory_note': f'not measured: {e}'}
    return {
        'client_extra_memory_bytes': float(np.mean(extras)),
        'client_extra_memory_bytes_max': int(max(extras)),
        'client_forward_memory_bytes': int(self._forward),
        'memory_note': (f'TF allocator peak of one training step (batch '
                        f'{self.batch_size}) minus the forward-only peak, '
                        f'mean over {len(masks)} client(s) of round 0'),
    }


def evaluate_accuracy(task, process, state) -> Optional[float]:
  return float(loop.evaluate(task, process.get_model_weights(state))['accuracy'])


def _median(values):
  return float(statistics.median(values)) if values else None


class _Runner:
  """One configuration being benchmarked: its process, state and timings."""

  def __init__(self, config, task, ctx, seed):
    self.config, self.task, self.seed = config, task, seed
    row = {'name': config.name, 'algorithm': config.algorithm,
           'overrides': {k: str(v) for k, v in config.overrides.items()}}
    t = time.perf_counter()
    self.built = built = build_config(config, ctx)
    self.process = built.process
    state = self.process.initialize()
    try:  # the loop's seeded initial model, the same for every configuration
      state = self.process.set_model_weights(state, loop.initial_model_weights(task, seed))
      row['initial_model'] = 'seeded Keras init (loop.initial_model_weights)'
    except Exception as e:  # pylint: disable=broad-except
      row['initial_model'] = f'process.initialize() ({type(e).__name__})'
    self.state = state
    row['build_seconds'] = time.perf_counter() - t
    row.update(
        params_total=built.params_total, params_trainable=built.params_trainable,
        bytes_down_per_client=built.bytes.down_payload,
        bytes_up_per_client=built.bytes.up_payload,
        bytes_down_overhead_per_client=built.bytes.down_overhead,
        bytes_up_overhead_per_client=built.bytes.up_overhead)
    if built.bytes_note:
      row['bytes_note'] = built.bytes_note
    self.row = row
    self.round_seconds, self.data_seconds, self.examples = [], [], []
    self.next_seconds = []
    self.empty_seconds = []
    self.cpu_seconds = []

  def inputs(self, cohort, round_num, empty=False):
    return client_inputs(self.config, self.task, self.built, cohort, round_num,
                         self.seed, empty=empty)

  def train_round(self, round_num, cohort, timed):
    c0 = cpu_seconds()
    t0 = time.perf_counter()
    values = self.inputs(cohort, round_num)
    t1 = time.perf_counter()
    self.state = self.process.next(self.state, values).state
    t2 = time.perf_counter()
    c2 = cpu_seconds()
    logging.info('%s round %d: %.2fs (data %.3fs), %.2f CPU s', self.config.name,
                 round_num, t2 - t0, t1 - t0, c2 - c0)
    if timed:
      self.cpu_seconds.append(c2 - c0)
      self.round_seconds.append(t2 - t0)
      self.data_seconds.append(t1 - t0)
      self.next_seconds.append(t2 - t1)
      self.examples.append(sum(count_examples(self.task, c) for c in cohort))

  def empty_round(self, round_num, cohort, timed):
    """The same round on empty datasets: everything but client training."""
    values = self.inputs(cohort, round_num, empty=True)
    t0 = time.perf_counter()
    self.process.next(self.state, values)  # state not kept
    if timed:
      self.empty_seconds.append(time.perf_counter() - t0)

  def finish(self, client_memory, evaluate, first_cohort) -> dict:
    row = self.row
    median_round = _median(self.round_seconds)
    median_next = _median(self.next_seconds)
    overhead = _median(self.empty_seconds)
    client_seconds = (max(0.0, median_next - overhead)
                      if overhead is not None and median_next is not None else None)
    mean_examples = float(np.mean(self.examples)) if self.examples else 0.0
    row.update(
        clients_per_round=len(first_cohort),
        rounds_timed=len(self.round_seconds),
        round_seconds_all=self.round_seconds,
        empty_round_seconds_all=self.empty_seconds,
        median_round_seconds=median_round,
        round_cpu_seconds_all=self.cpu_seconds,
        median_round_cpu_seconds=_median(self.cpu_seconds),
        median_data_seconds=_median(self.data_seconds),
        median_next_seconds=median_next,
        median_empty_round_seconds=overhead,
        client_training_seconds=client_seconds,
        examples_per_round=mean_examples,
        examples_per_second=mean_examples / median_round if median_round else None,
        client_examples_per_second=(mean_examples / client_seconds
                                    if client_seconds else None),
    )
    if client_memory is not None:
      row.update(client_memory.measure(self.built))
    if evaluate:
      row['accuracy'] = evaluate_accuracy(self.task, self.process, self.state)
    return row


def run_configs(configs, task, ctx, cohorts, *, seed, warmup, empty_rounds,
                client_memory, evaluate) -> list[dict]:
  """Runs the configurations interleaved: round r of each, then round r+1.

  Interleaving (with the order rotated every round) spreads the machine's
  load changes over every configuration instead of favouring whichever ran
  in a quiet minute.
  """
  runners, rows = [], []
  for config in configs:
    try:
      runners.append(_Runner(config, task, ctx, seed))
      rows.append(None)
    except Skip as e:
      logging.warning('skipping %s: %s', config.name, e)
      rows.append({'name': config.name, 'algorithm': config.algorithm, 'skipped': str(e)})

  def rotated(i):
    k = i % len(runners) if runners else 0
    return runners[k:] + runners[:k]

  for round_num, cohort in enumerate(cohorts):
    for runner in rotated(round_num):
      runner.train_round(round_num, cohort, timed=round_num >= warmup)
  last = len(cohorts) - 1
  if empty_rounds:
    for i in range(empty_rounds + 1):  # the first one warms the empty path
      for runner in rotated(i):
        runner.empty_round(last, cohorts[last], timed=i > 0)
  finished = iter(r.finish(client_memory, evaluate, cohorts[0]) for r in runners)
  return [row if row is not None else next(finished) for row in rows]


def keras_throughput(task, cohorts, seed, warmup, client_lr) -> dict:
  """Centralized `model.fit` on the same examples and batches, one pass per round."""
  tf.keras.utils.set_random_seed(seed)
  model = task.keras_model_fn()
  model.compile(optimizer=tf.keras.optimizers.SGD(client_lr), loss=task.loss_fn())
  data = task.baseline.datasets

  def round_dataset(cohort):
    datasets = [data.train_preprocess_fn(data.train_data.create_tf_dataset_for_client(c))
                for c in cohort]
    merged = datasets[0]
    for d in datasets[1:]:
      merged = merged.concatenate(d)
    return merged

  seconds, examples = [], []
  for round_num, cohort in enumerate(cohorts):
    dataset = round_dataset(cohort)
    t0 = time.perf_counter()
    model.fit(dataset, epochs=1, verbose=0)
    dt = time.perf_counter() - t0
    if round_num >= warmup:
      seconds.append(dt)
      examples.append(sum(count_examples(task, c) for c in cohort))
  total = float(sum(seconds))
  return {
      'name': 'keras_centralized', 'algorithm': 'keras model.fit',
      'median_round_seconds': _median(seconds),
      'examples_per_round': float(np.mean(examples)) if examples else 0.0,
      'examples_per_second': (sum(examples) / total) if total else None,
  }


# ----------------------------------------------------------------------------
# Reports.
def add_ratios(rows: list[dict], keras: Optional[dict]) -> None:
  ref = next((r for r in rows if r['name'] == 'tff_fedavg' and 'skipped' not in r), None)
  for r in rows:
    if 'skipped' in r:
      continue
    if ref:
      r['round_time_vs_tff_fedavg'] = r['median_round_seconds'] / ref['median_round_seconds']
      if r.get('median_round_cpu_seconds') and ref.get('median_round_cpu_seconds'):
        r['round_cpu_vs_tff_fedavg'] = (
            r['median_round_cpu_seconds'] / ref['median_round_cpu_seconds'])
      if r.get('client_training_seconds') and ref.get('client_training_seconds'):
        r['client_time_vs_tff_fedavg'] = (
            r['client_training_seconds'] / ref['client_training_seconds'])
      ref_bytes = ref['bytes_down_per_client'] + ref['bytes_up_per_client']
      own = r['bytes_down_per_client'] + r['bytes_up_per_client']
      r['bytes_vs_tff_fedavg'] = own / ref_bytes if ref_bytes else None
    if keras and keras.get('examples_per_second') and r.get('examples_per_second'):
      r['throughput_vs_keras'] = r['examples_per_second'] / keras['examples_per_second']


def _fmt(value, spec='.3g'):
  if value is None:
    return '-'
  if isinstance(value, float):
    return format(value, spec)
  return str(value)


def _mib(value):
  return '-' if value is None else f'{value / 2**20:.2f}'


def _mem(row):
  if row.get('client_extra_memory_bytes') is None:
    return '-'
  return (f"{_mib(row['client_extra_memory_bytes'])}/"
          f"{_mib(row['client_extra_memory_bytes_max'])}")


def markdown(report: dict) -> str:
  lines = [f"# Benchmark: {report['task']}", '']
  lines.append(f"Machine: {report['machine']}. Data: {report['data']}. "
               f"Clients per round: {report['clients_per_round']}, rounds: "
               f"{report['rounds']} ({report['warmup_rounds']} warm-up), client "
               f"batch size {report['client_batch_size']}, epochs "
               f"{report['client_epochs']}, max batches {report['client_max_batches']}, "
               f"seed {report['seed']}. Runtime: {report['runtime']}.")
  lines.append('')
  if report.get('rows'):
    lines.append('| config | s/round | vs TFF | CPU s/round | CPU vs TFF | client s | '
                 'client vs TFF | ex/s | '
                 'client ex/s | vs Keras | down KiB | up KiB | bytes vs TFF | '
                 'extra mem MiB mean/max | accuracy |')
    lines.append('|' + '---|' * 15)
    for r in report['rows']:
      if 'skipped' in r:
        lines.append(f"| {r['name']} | skipped: {r['skipped']} |" + ' |' * 13)
        continue
      lines.append(
          f"| {r['name']} | {_fmt(r['median_round_seconds'])} | "
          f"{_fmt(r.get('round_time_vs_tff_fedavg'))} | "
          f"{_fmt(r.get('median_round_cpu_seconds'))} | "
          f"{_fmt(r.get('round_cpu_vs_tff_fedavg'))} | "
          f"{_fmt(r.get('client_training_seconds'))} | "
          f"{_fmt(r.get('client_time_vs_tff_fedavg'))} | "
          f"{_fmt(r.get('examples_per_second'), '.0f')} | "
          f"{_fmt(r.get('client_examples_per_second'), '.0f')} | "
          f"{_fmt(r.get('throughput_vs_keras'))} | "
          f"{r['bytes_down_per_client'] / 1024:.1f} | {r['bytes_up_per_client'] / 1024:.1f} | "
          f"{_fmt(r.get('bytes_vs_tff_fedavg'))} | {_mem(r)} | "
          f"{_fmt(r.get('accuracy'), '.4f')} |")
    keras = report.get('keras')
    if keras:
      lines.append(f"| keras_centralized | {_fmt(keras['median_round_seconds'])} | | | | | | "
                   f"{_fmt(keras['examples_per_second'], '.0f')} | | 1 | | | | | |")
  if report.get('scaling'):
    lines += ['', '## Seconds per round vs clients per round', '',
              '| config | ' + ' | '.join(str(c) for c in report['cohorts'])
              + ' | s/client (slope) | intercept s | R^2 |',
              '|' + '---|' * (len(report['cohorts']) + 4)]
    for name, s in report['scaling'].items():
      if 'skipped' in s:
        lines.append(f'| {name} | skipped: {s["skipped"]} |')
        continue
      lines.append(f"| {name} | " + ' | '.join(_fmt(v) for v in s['median_round_seconds'])
                   + f" | {_fmt(s.get('slope'))} | {_fmt(s.get('intercept'))} | {_fmt(s.get('r2'), '.4f')} |")
      if s.get('cpu_fit'):
        fit = s['cpu_fit']
        lines.append(f"| {name} CPU s | " + ' | '.join(_fmt(v) for v in s['median_round_cpu_seconds'])
                     + f" | {_fmt(fit['slope'])} | {_fmt(fit['intercept'])} | {_fmt(fit['r2'], '.4f')} |")
    lines += runtime.ResourceUsage.markdown_rows(report)
  lines += ['', 'How to read it: ' + report['method_note'], '']
  for r in report.get('rows', []):
    if r.get('bytes_note'):
      lines.append(f"- {r['name']} bytes: {r['bytes_note']}")
    if r.get('memory_note'):
      lines.append(f"- {r['name']} memory: {r['memory_note']}")
  return '\n'.join(lines) + '\n'


METHOD_NOTE = (
    's/round: median wall seconds of process.next incl. building the cohort '
    'datasets, after warm-up. CPU s/round: median user+system CPU seconds of '
    'the same (this process and its TFF worker); steadier than wall time on a '
    'shared machine. client s: seconds of process.next minus those of '
    'the same round on empty client datasets (what remains is local '
    'training). ex/s: examples trained per round / s/round. vs TFF: ratio to '
    'tff_fedavg (TFF build_weighted_fed_avg with TFF\'s data path); vs Keras: '
    'ratio of ex/s to centralized Keras model.fit on the same examples and '
    'batch size. Bytes: exact payload per client per round from the '
    'process type signature. extra mem: client extra training memory, the '
    'TensorFlow allocator peak of one training step on one batch that '
    'differentiates only the variables the client trains, minus the '
    'forward-only peak, each in a fresh subprocess (tff_partial.measure.memory; '
    'mean and max over the first clients\' masks). All '
    'configurations ran side by side in one process on the same sampled '
    'clients, interleaved round by round; on a shared machine timings are '
    'still noisy.')


def linear_fit(xs, ys) -> dict:
  xs, ys = np.asarray(xs, float), np.asarray(ys, float)
  slope, intercept = np.polyfit(xs, ys, 1)
  pred = slope * xs + intercept
  ss_tot = float(np.sum((ys - ys.mean()) ** 2))
  r2 = 1.0 - float(np.sum((ys - pred) ** 2)) / ss_tot if ss_tot > 0 else 1.0
  return {'slope': float(slope), 'intercept': float(intercept), 'r2': r2}


def machine() -> str:
  gpus = tf.config.list_physical_devices('GPU')
  return (f'{os.cpu_count()} CPU cores, {psutil.virtual_memory().total / 2**30:.0f} GiB RAM, '
          f'{"GPU " + str(len(gpus)) if gpus else "no GPU"}, TF {tf.__version__}, '
          f'TFF {tff.__version__}, load average {os.getloadavg()[0]:.1f} at start')


def select_vs_broadcast() -> dict:
  """Seconds of a select round against a broadcast round of the same payload."""
  rows = []
  for bucket in _SELECT_BUCKETS.value:
    try:
      bucket_size = int(bucket)
    except ValueError:
      raise flag_groups.FlagError(
          f'--benchmark_select_buckets: {bucket!r} is not an integer') from None
    rows.append(select_bench.time_select_vs_broadcast(
        num_keys=_SELECT_KEYS.value, clients=_SELECT_CLIENTS.value,
        row_dim=_SELECT_ROW_DIM.value, bucket_size=bucket_size))
    logging.info('select vs broadcast: %s', rows[-1])
  return {'machine': machine(), 'select_vs_broadcast': rows}


def select_markdown(report: dict) -> str:
  lines = ['# Benchmark: tff.federated_select vs broadcast of the same payload', '',
           f"Machine: {report['machine']}.", '',
           '| rows per key | select calls per client | KiB per client | clients | '
           'select s | broadcast s | select / broadcast |',
           '|---|---|---|---|---|---|---|']
  for r in report['select_vs_broadcast']:
    lines.append(f"| {r['bucket_size']} | {r['select_calls_per_client']} | "
                 f"{r['bytes_per_client'] / 1024:.0f} | {r['clients']} | "
                 f"{_fmt(r['select_s'])} | {_fmt(r['broadcast_s'])} | {_fmt(r['ratio'])} |")
  return '\n'.join(lines) + '\n'


def run(output_dir: Optional[str]) -> dict:
  """The benchmark selected by the flags; returns the report dict."""
  runtime_flags.configure_from_flags()
  if _SELECT_BUCKETS.value:
    report = select_vs_broadcast()
    write_report(output_dir, report)
    return report
  task_name = flag_groups.TASK.value
  seed = flag_groups.SEED.value
  rounds, warmup = _ROUNDS.value, _WARMUP.value
  if rounds <= warmup:
    raise flag_groups.FlagError(
        f'--benchmark_rounds={rounds} must exceed --benchmark_warmup_rounds={warmup}')
  configs = selected_configs(task_name)
  aggregators.validate_flags('fedavg')
  task = flag_groups.create_task(task_name)
  client_ids = list(task.train_data.client_ids)
  scaling = _COHORTS.value is not None
  if _LOCAL_WORKERS.value and (not scaling or runtime_flags.WORKERS.value):
    raise flag_groups.FlagError(
        '--benchmark_local_workers needs --benchmark_cohorts and no --workers')
  cohort_sizes = ([int(c) for c in _COHORTS.value] if scaling
                  else [flag_groups.CLIENTS_PER_ROUND.value])
  for c in cohort_sizes:
    if c <= 0:
      raise flag_groups.FlagError(f'clients per round {c} must be positive')

  def make_ctx(cohort_size):
    server_opt = flag_groups.server_optimizer()
    choice = aggregators.build(task, cohort_size, rounds, server_opt)
    return method.MethodContext(
        task=task, client_optimizer=flag_groups.client_optimizer(),
        server_optimizer=choice.server_optimizer or server_opt,
        model_aggregator=choice.factory, seed=seed,
        clients_per_round=cohort_size, total_rounds=rounds,
        loop_implementation=flag_groups.loop_implementation())

  report = {
      'task': task_name, 'machine': machine(),
      'data': f'{task.data_source}: {task.data_description or task.population}',
      'population': task.population, 'clients_per_round': cohort_sizes[0],
      'rounds': rounds, 'warmup_rounds': warmup, 'seed': seed,
      'client_batch_size': flag_groups.CLIENT_BATCH_SIZE.value,
      'client_epochs': flag_groups.CLIENT_EPOCHS.value,
      'client_max_batches': flag_groups.CLIENT_MAX_ELEMENTS.value,
      'runtime': ('workers ' + ','.join(runtime_flags.WORKERS.value)
                  if runtime_flags.WORKERS.value else 'TFF local C++ runtime'),
      'method_note': METHOD_NOTE,
  }
  if not scaling:
    size = cohort_sizes[0]
    cohorts = [sample_cohort(client_ids, seed, r, size) for r in range(rounds)]
    ctx = make_ctx(size)
    rows = run_configs(
        configs, task, ctx, cohorts, seed=seed, warmup=warmup,
        empty_rounds=_EMPTY_ROUNDS.value,
        client_memory=(ClientMemory(task, flag_groups.CLIENT_BATCH_SIZE.value, seed,
                                    min(_MEMORY_CLIENTS.value, size))
                       if _MEMORY.value else None),
        evaluate=_EVAL.value)
    keras = None
    if _KERAS.value:
      keras = keras_throughput(task, cohorts, seed, warmup,
                               flags.FLAGS.client_learning_rate)
    add_ratios(rows, keras)
    report.update(rows=rows, keras=keras)
  else:
    report['cohorts'] = cohort_sizes
    report['scaling'] = collections.OrderedDict(
        (c.name, {'median_round_seconds': []}) for c in configs)
    sweep_workers = (runtime.local_workers(_LOCAL_WORKERS.value) if _LOCAL_WORKERS.value
                     else contextlib.nullcontext(runtime.LocalWorkers()))
    with sweep_workers as workers:
      if workers:
        runtime_flags.configure(workers.addresses)
        report['runtime'] = (f'{len(workers)} local workers, at most '
                             f'{runtime_flags.WORKER_MAX_CLIENTS_PER_SUBROUND.value or "all"} '
                             'clients per sub-round')
      for size in cohort_sizes:
        with runtime.ResourceUsage(workers) as usage:
          rows = run_configs(
              configs, task, make_ctx(size),
              [sample_cohort(client_ids, seed, r, size) for r in range(rounds)],
              seed=seed, warmup=warmup, empty_rounds=0, client_memory=None,
              evaluate=False)
        for key, value in usage.result().items():
          report.setdefault(key, []).append(value)
        _record_scaling(report, rows, size)
        write_report(output_dir, report)  # what finished survives a kill
    for entry in report['scaling'].values():
      if 'skipped' not in entry and len(cohort_sizes) > 1:
        entry.update(linear_fit(cohort_sizes, entry['median_round_seconds']))
        entry['cpu_fit'] = linear_fit(cohort_sizes, entry['median_round_cpu_seconds'])
  write_report(output_dir, report)
  return report


def _record_scaling(report, rows, size) -> None:
  for row in rows:
    entry = report['scaling'][row['name']]
    if 'skipped' in row:
      entry.clear()
      entry['skipped'] = row['skipped']
      continue
    entry['median_round_seconds'].append(row['median_round_seconds'])
    entry.setdefault('median_round_cpu_seconds', []).append(
        row['median_round_cpu_seconds'])
    logging.info('%s: %d clients/round: %.2fs (%.2f CPU s)', row['name'], size,
                 row['median_round_seconds'], row['median_round_cpu_seconds'])


def report_markdown(report: dict) -> str:
  if 'select_vs_broadcast' in report:
    return select_markdown(report)
  return markdown(report)


def write_report(output_dir: Optional[str], report: dict) -> None:
  """benchmark.json and benchmark.md into output_dir (nothing if None)."""
  if not output_dir:
    return
  os.makedirs(output_dir, exist_ok=True)
  with open(os.path.join(output_dir, 'benchmark.json'), 'w') as f:
    json.dump(report, f, indent=2)
  with open(os.path.join(output_dir, 'benchmark.md'), 'w') as f:
    f.write(report_markdown(report))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  try:
    report = run(flag_groups.OUTPUT_DIR.value)
  except (flag_groups.FlagError, ValueError) as e:
    sys.exit(f'error: {e}')
  print(report_markdown(report))


if __name__ == '__main__':
  app.run(main)
