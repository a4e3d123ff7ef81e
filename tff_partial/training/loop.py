"""The one training loop, shared by every method and binary.

Built on `tff.simulation.run_training_process` with TFF's program managers:
`tff.program.FileProgramStateManager` (checkpoints, resume),
`tff.program.CSVFileReleaseManager` (metrics.csv, one row per round) and
`tff.program.TensorBoardReleaseManager`, plus two small release managers of
ours: one that adds the per-round constants (exact bytes per client, epsilon so
far) to every release, and one that logs one progress line per round.

Reproducibility: the initial model comes from a seeded Keras initialization;
clients are sampled with TFF's seeded `build_uniform_sampling_fn` (a function
of (seed, round)); each client's raw data is shuffled with a seed derived from
(seed, round, client slot). A run killed and restarted with the same flags
resumes from its last checkpoint and ends with the same weights and metrics as
an uninterrupted one.
"""

import asyncio
import collections
import contextlib
import dataclasses
import json
import math
import os
import time
from typing import Any, Callable, Optional, Sequence

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import registry
from tff_partial.runtime import local as local_runtime
from tff_partial.training import atomic
from tff_partial.training import method as method_lib
from tff_partial.training import resumable

_SHUFFLE_BUFFER = 1000


class RunConfigMismatchError(ValueError):
  """The output directory holds a run with different flags."""


@dataclasses.dataclass
class TrainingResult:
  state: Any
  round_metrics: list
  final_eval: dict


def client_seed(seed: int, round_num: int, client_index: int) -> int:
  """A 31-bit seed that is a pure function of (seed, round, client slot)."""
  mixed = np.random.SeedSequence([seed, round_num, client_index]).generate_state(1)
  return int(mixed[0] & 0x7FFFFFFF)


def seeded_shuffle(dataset: tf.data.Dataset, seed: int, round_num: int,
                   client_index: int,
                   buffer_size: int = _SHUFFLE_BUFFER) -> tf.data.Dataset:
  """`dataset` shuffled (reshuffled each epoch) as a pure function of its seeds.

  Two flaws of `Dataset.shuffle(seed=...)` make it unfit here (measured with
  TF 2.14, see tests/determinism_test.py):
  * its order depends on the global TF seed (`tf.random.set_seed`), which a
    fresh run and a resumed run set differently;
  * eager `shuffle` builds a `ShuffleDatasetV3` whose serialized graph carries
    the resource handle of its seed generator. Where the graph is rebuilt
    (TFF's worker, tf.data's own graph rewrites) the kernel looks that name up
    and, when a live generator of another dataset has it, shares that one
    (other seeds, advanced state). With clients run concurrently, which one
    it finds depends on timing: two fresh runs gave different orders.
  The V1 `ShuffleDataset` kernel serializes only its two seeds, so a rebuilt
  dataset always starts from them; both seeds are explicit, so the global
  seed plays no part. Same buffer semantics as `Dataset.shuffle`.
  """
  seeds = np.random.SeedSequence([seed, round_num, client_index, 1]).generate_state(2)
  # (0, 0) would mean "seed at random" to the kernel.
  seed1, seed2 = int(seeds[0] & 0x7FFFFFFF) | 1, int(seeds[1] & 0x7FFFFFFF)
  variant = tf.raw_ops.ShuffleDataset(
      input_dataset=tf.data.experimental.to_variant(dataset),
      buffer_size=tf.constant(buffer_size, tf.int64),
      seed=tf.constant(seed1, tf.int64),
      seed2=tf.constant(seed2, tf.int64),
      output_types=dataset._flat_types,  # pylint: disable=protected-access
      output_shapes=dataset._flat_shapes,  # pylint: disable=protected-access
      reshuffle_each_iteration=True)
  return tf.data.experimental.from_variant(variant, dataset.element_spec)


_NO_AUTOTUNE = tf.data.Options()
_NO_AUTOTUNE.autotune.enabled = False


def autotune_off(value):
  """`value` (a dataset, or a structure of datasets) with tf.data's autotuning off.

  When an iterator over a dataset ends, its teardown waits for the tf.data
  autotuner's next wake-up, which comes at 10 ms x (2^k - 1) after the
  iterator started (its period starts at 10 ms and doubles). Measured on two
  2-core machines: Keras rounds that finished their steps at 1.6 s ended at
  2.55 s; FedAvg rounds of 10 FEMNIST clients took 0.89x (oneDNN off) and
  0.93x (on) the wall time with autotuning off in the clients' datasets, at
  the same CPU time (`docs/benchmarks.md`, issue 17).
  These pipelines are short (a client's examples, preprocessed) or cached,
  so the autotuner has little to tune. Written here: TFF and Keras have no
  option for it.
  """
  return tf.nest.map_structure(
      lambda d: d.with_options(_NO_AUTOTUNE) if isinstance(d, tf.data.Dataset) else d, value)


def initial_model_weights(task: registry.Task, seed: int) -> tff.learning.models.ModelWeights:
  """The task model's Keras initialization under `seed` (same in every run)."""
  tf.keras.utils.set_random_seed(seed)
  model = task.keras_model_fn()
  return tff.learning.models.ModelWeights.from_model(model)


class _Evaluator:
  """Keras evaluation of server model weights on all examples of the task's
  evaluation split (`task.eval_split`: the test clients, or validation examples)."""

  def __init__(self, task: registry.Task):
    self._task = task
    self._model = None
    self._dataset = None

  def __call__(self, model_weights) -> dict:
    if self._model is None:
      self._model = self._task.compiled_keras_model()
      self._dataset = autotune_off(self._task.centralized_eval_dataset().cache())
    model_weights.assign_weights_to(self._model)
    results = self._model.evaluate(self._dataset, verbose=0, return_dict=True)
    return {k: float(v) for k, v in results.items()}


def evaluate(task: registry.Task, model_weights) -> dict:
  """Loss and metrics of `model_weights` on all examples of `task.eval_split`."""
  return _Evaluator(task)(model_weights)


def build_client_selection_fn(
    task: registry.Task,
    built: method_lib.BuiltMethod,
    clients_per_round: int,
    seed: int,
    client_indices_fn: Optional[Callable[[int], Sequence[int]]] = None,
) -> Callable[[int], list]:
  """round_num -> the list of client values `built.process.next` takes.

  `client_indices_fn(round_num)`, when given, picks the clients (indices into
  `client_ids`) instead of uniform sampling; DP-FTRL needs each client at most
  once per epoch (`tff_partial.privacy.sampling`).
  """
  client_ids = list(task.train_data.client_ids)
  sample = tff.simulation.build_uniform_sampling_fn(
      client_ids, replace=False, random_seed=seed)

  def select(round_num: int) -> list:
    if client_indices_fn is not None:
      chosen = [client_ids[int(i)] for i in client_indices_fn(round_num)]
    else:
      chosen = sample(round_num, clients_per_round)
    return [client_value(task, built, seed, round_num, index, client_id)
            for index, client_id in enumerate(chosen)]

  return select


def _restarting_worker(select: Callable[[int], list], restart_mb: float) -> Callable[[int], list]:
  """`select`, first restarting the local worker once it has grown by `restart_mb`.

  Growth is counted from the worker's resident memory when first measured
  here (before round 1, or after the first round a restarted worker ran).
  TFF's `run_training_process` calls the selection right before each round's
  `next`: the one per-round hook it has. Negative `restart_mb`: never
  restart.
  """
  if restart_mb < 0:
    return select
  baseline = None

  def select_after_restart(round_num: int) -> list:
    nonlocal baseline
    rss = local_runtime.local_worker_rss_mb()
    if not math.isnan(rss):
      if baseline is None:
        baseline = rss
      if rss - baseline >= restart_mb and local_runtime.restart_local_worker():
        logging.info('Restarted the local TFF worker before round %d: it held %.0f MB, '
                     '%.0f more than when first measured', round_num, rss, rss - baseline)
        baseline = None
    return select(round_num)

  return select_after_restart


def client_value(task: registry.Task, built: method_lib.BuiltMethod, seed: int,
                 round_num: int, client_index: int, client_id: str,
                 empty: bool = False):
  """What `built.process.next` takes for one client: its data, shuffled
  (`seeded_shuffle`) and preprocessed, through `built.client_input_fn`, with
  tf.data's autotuning off (`autotune_off`).

  `empty` keeps none of the client's examples (benchmarks time a round
  without client training this way).
  """
  raw = task.train_data.create_tf_dataset_for_client(client_id)
  if empty:
    raw = raw.take(0)
  raw = seeded_shuffle(raw, seed, round_num, client_index)
  if task.random_preprocessing:
    # Random ops that preprocessing traces (CIFAR-10's crops and flips) take
    # their op seeds from the global seed at trace time: make it a function of
    # (seed, round, client) too. Only then: setting the global seed clears
    # TensorFlow's eager kernel caches, which tripled the cost of building a
    # client's dataset (0.079 -> 0.239 s per 10 FEMNIST clients, measured).
    tf.random.set_seed(client_seed(seed, round_num, client_index))
  dataset = task.preprocess_train_client(raw)
  if built.client_input_fn is not None:
    return autotune_off(built.client_input_fn(round_num, client_index, client_id, dataset))
  return autotune_off(dataset)


def _flatten(metrics, prefix=''):
  out = collections.OrderedDict()
  for key, value in metrics.items():
    name = f'{prefix}{key}'
    if isinstance(value, (dict, collections.OrderedDict)):
      out.update(_flatten(value, name + '/'))
    else:
      out[name] = value
  return out


def _first_matching(metrics: dict, suffixes) -> Optional[float]:
  for suffix in suffixes:
    for key, value in metrics.items():
      if key.endswith(suffix):
        return float(np.asarray(value))
  return None


class _AddConstants(tff.program.ReleaseManager):
  """Adds per-round bytes and epsilon to every release, then forwards it."""

  def __init__(self, inner, built, epsilon_fn, privacy_note=None):
    self._inner = list(inner)
    self._bytes = built.bytes
    self._epsilon_fn = epsilon_fn
    self._privacy_note = privacy_note
    self.history = []

  async def release(self, value, key):
    value = collections.OrderedDict(_flatten(value))
    value['comm/bytes_down_per_client'] = self._bytes.down_payload
    value['comm/bytes_up_per_client'] = self._bytes.up_payload
    if self._epsilon_fn is not None:
      value['privacy/epsilon'] = float(self._epsilon_fn(int(key))) if key else 0.0
      if self._privacy_note:  # text: in metrics.csv, skipped by TensorBoard
        value['privacy/note'] = self._privacy_note
    self.history.append((int(key), dict(value)))
    await asyncio.gather(*[m.release(value, key=key) for m in self._inner])


class ProgressReleaseManager(tff.program.ReleaseManager):
  """Logs one line per round: loss, accuracy, seconds, ETA, bytes, epsilon."""

  def __init__(self, total_rounds: int, print_fn=None):
    self._total = total_rounds
    self._times = []
    self._print = print_fn or logging.info

  async def release(self, value, key):
    key = int(key)
    loss = _first_matching(value, ('train/loss',))
    acc = _first_matching(value, ('train/accuracy', 'train/sparse_categorical_accuracy'))
    eval_acc = _first_matching(value, ('evaluation/accuracy',))
    seconds = value.get(tff.simulation.TRAINING_TIME_KEY)
    parts = [f'round {key}/{self._total}']
    if key == 0:
      parts.append('initial model')
    if loss is not None:
      parts.append(f'loss {loss:.4f}')
    if acc is not None:
      parts.append(f'acc {acc:.4f}')
    if eval_acc is not None:
      parts.append(f'test acc {eval_acc:.4f}')
    if seconds is not None:
      self._times.append(float(seconds))
      eta = np.mean(self._times[-10:]) * max(self._total - key, 0)
      parts.append(f'{float(seconds):.1f}s')
      parts.append(f'ETA {time.strftime("%H:%M:%S", time.gmtime(eta))}')
    parts.append(
        f'down {value["comm/bytes_down_per_client"] / 1e6:.3f} MB '
        f'up {value["comm/bytes_up_per_client"] / 1e6:.3f} MB per client')
    if 'privacy/epsilon' in value:
      note = value.get('privacy/note')
      parts.append(f'epsilon {value["privacy/epsilon"]:.3f}' + (f' ({note})' if note else ''))
    self._print(' | '.join(parts))


def check_or_save_flags(output_dir: str, run_flags: dict,
                        flag_defaults: Optional[dict] = None) -> None:
  """Saves `flags.json`, or checks it equals the one of the run being resumed.

  A flag that the saved file lacks (one added to the package after that run
  started) counts as having had its value in `flag_defaults`, so a run keeps
  resuming across such an upgrade as long as the new flag is left at its default.
  """
  path = os.path.join(output_dir, resumable.FLAGS_FILE)
  saved = resumable.read_flags(output_dir)
  if saved is not None:
    saved = {**(flag_defaults or {}), **saved}
    keys = (set(saved) | set(run_flags)) - resumable.RESUMABLE_FLAG_CHANGES
    diff = sorted(k for k in keys if saved.get(k) != run_flags.get(k))
    if diff:
      details = ', '.join(f'--{k}: saved {saved.get(k)!r} vs now {run_flags.get(k)!r}' for k in diff)
      raise RunConfigMismatchError(
          f'{output_dir} holds a run with different flags ({details}); use another '
          '--experiment_name or --root_output_dir, or the same flags to resume it')
    started, now = saved.get(resumable.CPU_PATH_KEY), run_flags.get(resumable.CPU_PATH_KEY)
    if started and now and started != now:
      logging.warning('%s started on another CPU path (%s) than it resumes on (%s): the '
                      'paths round differently, so its results mix both', output_dir,
                      started, now)
    return
  os.makedirs(output_dir, exist_ok=True)
  with atomic.atomic_write(path) as f:
    json.dump(run_flags, f, indent=2, sort_keys=True)


def save_model_weights(output_dir: str, task: registry.Task, model_weights) -> str:
  """Writes the Keras `model.get_weights()` list of the model as an .npz (atomically)."""
  model = task.keras_model_fn()
  model_weights.assign_weights_to(model)
  path = os.path.join(output_dir, resumable.WEIGHTS_FILE)
  with atomic.atomic_write(path, 'wb') as f:
    np.savez(f, *model.get_weights())
  return path


def _read_final_eval(output_dir: str) -> Optional[dict]:
  """final_eval.json of a finished run, or None when it has none."""
  if not os.path.exists(os.path.join(output_dir, resumable.WEIGHTS_FILE)):
    return None
  try:
    with open(os.path.join(output_dir, resumable.FINAL_EVAL_FILE)) as f:
      return json.load(f)
  except FileNotFoundError:
    return None


def read_model_weights(path: str) -> list:
  """The Keras `get_weights()` list that `save_model_weights` wrote to `path`."""
  with np.load(path) as data:  # np.savez names them arr_0, arr_1, ...
    return [data[f'arr_{i}'] for i in range(len(data.files))]


def _current_event_loop() -> asyncio.AbstractEventLoop:
  """The thread's event loop, made anew if something (`asyncio.run`) closed it.

  `tff.simulation.run_training_process` calls `asyncio.get_event_loop()`,
  which raises once an earlier `asyncio.run` in the process cleared the loop.
  """
  try:
    loop = asyncio.get_event_loop()
    if not loop.is_closed():
      return loop
  except RuntimeError:
    pass
  loop = asyncio.new_event_loop()
  asyncio.set_event_loop(loop)
  return loop


def run_training(
    task: registry.Task,
    built: method_lib.BuiltMethod,
    *,
    total_rounds: int,
    clients_per_round: int,
    seed: int,
    output_dir: Optional[str],
    rounds_per_eval: int = 1,
    rounds_per_checkpoint: int = 10,
    epsilon_fn: Optional[Callable[[int], float]] = None,
    client_indices_fn: Optional[Callable[[int], Sequence[int]]] = None,
    run_flags: Optional[dict] = None,
    print_fn: Optional[Callable[[str], None]] = None,
    privacy_note: Optional[str] = None,
    flag_defaults: Optional[dict] = None,
    worker_restart_mb: float = local_runtime.DEFAULT_WORKER_RESTART_MB,
) -> TrainingResult:
  """Trains `built.process` on `task`; resumes from `output_dir` if it holds a run.

  With `output_dir=None` nothing is written (no checkpoints, no resume).
  `privacy_note` (e.g. a public DP noise seed's) follows every epsilon printed.
  `worker_restart_mb`: on the local runtime, its TFF worker is restarted
  before a round once it has grown by this many MB since the loop first
  measured it (`local.LocalContext.restart_worker`: it keeps megabytes a
  round); the results are the same. 0: before every round; negative: never.
  """
  if clients_per_round > task.population:
    raise ValueError(
        f'--clients_per_round={clients_per_round} is larger than the population '
        f'of --task={task.name} ({task.population} train clients)')
  process = built.process
  managers = [ProgressReleaseManager(total_rounds, print_fn)]
  state_manager = None
  if output_dir is not None:
    if run_flags is not None:
      check_or_save_flags(output_dir, run_flags, flag_defaults)
    os.makedirs(output_dir, exist_ok=True)
    for path in resumable.remove_stale_temp_files(output_dir):
      logging.info('Removed %s, a partial write of a killed earlier process', path)
    managers += [
        tff.program.CSVFileReleaseManager(
            file_path=os.path.join(output_dir, resumable.METRICS_FILE), key_fieldname='round_num'),
        tff.program.TensorBoardReleaseManager(
            os.path.join(output_dir, resumable.TENSORBOARD_DIR)),
    ]
    state_manager = tff.program.FileProgramStateManager(
        os.path.join(output_dir, resumable.CHECKPOINTS_DIR), keep_total=3, keep_first=True)
  release = _AddConstants(managers, built, epsilon_fn, privacy_note)
  evaluator = _Evaluator(task)

  def evaluation_fn(state, unused_clients):
    return evaluator(process.get_model_weights(state))

  loop = _current_event_loop()
  versions = loop.run_until_complete(state_manager.get_versions()) if state_manager else None
  latest = max(versions) if versions else None
  if latest is not None and latest > total_rounds:
    raise RunConfigMismatchError(
        f'{output_dir} holds a checkpoint of round {latest}, beyond '
        f'--total_rounds={total_rounds}; use --total_rounds>={latest} or another '
        '--experiment_name')
  if latest == total_rounds:
    # Trained to the end. Finished (final outputs written last, atomically):
    # nothing to do. Killed before its final outputs: write them.
    state = loop.run_until_complete(state_manager.load(latest, process.initialize()))
    final_eval = _read_final_eval(output_dir)
    if final_eval is not None:
      (print_fn or logging.info)(
          f'{output_dir} holds a finished run (round {latest}/{total_rounds}); '
          'nothing to do')
      return TrainingResult(state, [], final_eval)
    logging.info('Round %d is checkpointed in %s; writing the final outputs',
                 latest, output_dir)
    final_eval = evaluator(process.get_model_weights(state))
    _write_final_outputs(output_dir, task, process.get_model_weights(state), final_eval)
    return TrainingResult(state, [], final_eval)
  if latest is None:
    # Seeded initial model, saved as version 0 so that run_training_process
    # starts from it (and a resumed run starts from the same one).
    state = process.set_model_weights(process.initialize(), initial_model_weights(task, seed))
    initial = collections.OrderedDict(evaluation=evaluation_fn(state, None))
    loop.run_until_complete(release.release(initial, key=0))
    if state_manager is not None:
      loop.run_until_complete(state_manager.save(state, 0))
  else:
    logging.info('Resuming from checkpoint round %d in %s', latest, output_dir)
    state = None
    # A run extended to more rounds: its final outputs describe an earlier
    # round; without the mark, a kill after the new last checkpoint is not
    # taken for a finished run.
    with contextlib.suppress(FileNotFoundError):
      os.remove(os.path.join(output_dir, resumable.FINAL_EVAL_FILE))

  if state_manager is None:
    # No checkpoints: give run_training_process a process whose initialize is
    # not used (it only initializes when there is no saved state), by saving
    # the initial state into an in-memory manager.
    state_manager = _MemoryStateManager(state)

  final_state = tff.simulation.run_training_process(
      training_process=process,
      training_selection_fn=_restarting_worker(
          build_client_selection_fn(task, built, clients_per_round, seed, client_indices_fn),
          worker_restart_mb),
      total_rounds=total_rounds,
      evaluation_fn=evaluation_fn,
      evaluation_selection_fn=lambda round_num: None,
      rounds_per_evaluation=rounds_per_eval,
      program_state_manager=state_manager,
      rounds_per_saving_program_state=rounds_per_checkpoint,
      metrics_managers=[release],
  )
  final_weights = process.get_model_weights(final_state)
  final_eval = evaluator(final_weights)
  if output_dir is not None:
    # The last round's state first, so that a run killed from here on is
    # recognized as trained to the end and only its outputs are written again.
    if total_rounds % rounds_per_checkpoint:
      loop.run_until_complete(state_manager.save(final_state, total_rounds))
    _write_final_outputs(output_dir, task, final_weights, final_eval)
  return TrainingResult(final_state, [m for _, m in release.history], final_eval)


def _write_final_outputs(output_dir, task, final_weights, final_eval) -> None:
  """model_weights.npz, then final_eval.json (the mark of a finished run)."""
  save_model_weights(output_dir, task, final_weights)
  with atomic.atomic_write(os.path.join(output_dir, resumable.FINAL_EVAL_FILE)) as f:
    json.dump(final_eval, f, indent=2)


class _MemoryStateManager(tff.program.ProgramStateManager):
  """Holds the seeded initial state in memory (runs without an output dir)."""

  def __init__(self, initial_state):
    self._states = {0: initial_state}

  async def get_versions(self):
    return sorted(self._states)

  async def load(self, version, structure):
    del structure
    return self._states[version]

  async def save(self, program_state, version):
    self._states = {version: program_state}

  async def remove_all(self):
    self._states = {}
