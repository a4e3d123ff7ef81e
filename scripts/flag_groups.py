"""Flag groups shared by every binary: task, data, optimizers, training, output.

One definition per concern (google-research `utils/task_utils.py` style):
task flags are generated from the task registry with each task's prefix,
optimizer flags are generated once for `client` and once for `server`.
"""

from typing import Optional

from absl import flags
import tensorflow_federated as tff

from tasks import registry
from tff_partial.training import client_loop


class FlagError(ValueError):
  """Bad flag value; the message names the flag and what is allowed."""


OPTIMIZERS = ('sgd', 'sgdm', 'adam', 'adagrad', 'yogi')

# --- task and data ---------------------------------------------------------
TASK = flags.DEFINE_string(
    'task', 'emnist_cnn',
    'Task name; one of: ' + ', '.join(registry.task_names()))
DATA_SOURCE = flags.DEFINE_enum(
    'data_source', 'auto', registry.DATA_SOURCES,
    "Where task data comes from. 'auto': TFF's real dataset (cache dir, "
    "download when online), else a local directory given by --data_dir in the "
    "dataset's public format; 'synthetic' only when asked for by name.")
DATA_DIR = flags.DEFINE_string(
    'data_dir', None,
    'Local data in the public format of the task (LEAF json for FEMNIST, TFF '
    'h5 for Shakespeare, JPEG class folders for CIFAR-10).')
CACHE_DIR = flags.DEFINE_string(
    'cache_dir', None, "Cache directory of TFF's datasets (tff.simulation.datasets).")
EVAL_SPLIT = flags.DEFINE_enum(
    'eval_split', 'test', registry.EVAL_SPLITS,
    "What the run evaluates on (metrics.csv's evaluation/*, final_eval.json): "
    "'test': the task's test clients; 'validation': --validation_fraction of "
    "every training client's examples, held out of training by a hash keyed "
    'with --seed (for tuning hyperparameters without the test clients).')
VALIDATION_FRACTION = flags.DEFINE_float(
    'validation_fraction', 0.1,
    'With --eval_split=validation: the fraction of each training client\'s '
    'examples held out, in (0, 1).')


def _define_task_hparam_flags():
  defined = {}
  for spec in registry.task_specs().values():
    for name, default in spec.hparams.items():
      flag_name = f'{spec.flag_prefix}_{name}'
      if flag_name in defined:
        continue
      help_text = spec.hparam_help.get(name, name) + f' (tasks: {spec.flag_prefix}_*)'
      if isinstance(default, bool):
        flags.DEFINE_bool(flag_name, default, help_text)
      elif isinstance(default, int):
        flags.DEFINE_integer(flag_name, default, help_text)
      elif isinstance(default, float):
        flags.DEFINE_float(flag_name, default, help_text)
      else:
        flags.DEFINE_string(flag_name, default, help_text)
      defined[flag_name] = spec.flag_prefix
  return defined


_TASK_HPARAM_FLAGS = _define_task_hparam_flags()

# --- client training ---------------------------------------------------------
CLIENT_EPOCHS = flags.DEFINE_integer('client_epochs', 1, 'Local epochs per round.')
CLIENT_BATCH_SIZE = flags.DEFINE_integer('client_batch_size', 20, 'Client batch size.')
CLIENT_MAX_ELEMENTS = flags.DEFINE_integer(
    'client_max_batches', -1,
    'At most this many batches (after batching, all epochs together) per client '
    'per round (-1: no limit).')
# How --client_epochs passes over a client's data (tasks/registry.py).
ACROSS_EPOCHS, PER_EPOCH = 'across_epochs', 'per_epoch'
CLIENT_EPOCH_BATCHING = flags.DEFINE_enum(
    'client_epoch_batching', ACROSS_EPOCHS, (ACROSS_EPOCHS, PER_EPOCH),
    'How --client_epochs > 1 batches: `across_epochs` (TFF\'s '
    'ClientSpec.num_epochs: the examples are repeated, then batched, so an '
    'epoch\'s last partial batch merges with the next epoch\'s examples) or '
    '`per_epoch` (Keras fit: each epoch is batched on its own, so a '
    'client takes exactly --client_epochs times the batches of one epoch, '
    'before --client_max_batches).')


def _batched_per_epoch() -> bool:
  """--client_epoch_batching=per_epoch: epochs repeat the batched data (create_task)."""
  return CLIENT_EPOCH_BATCHING.value == PER_EPOCH


CLIENT_LOOP = flags.DEFINE_enum(
    'client_loop', client_loop.AUTO, client_loop.CHOICES,
    'How a client iterates its dataset: `iterator` (a loop over the dataset '
    "iterator in the training graph, TFF's LoopImplementation.DATASET_ITERATOR), "
    "`reduce` (tf.data's dataset.reduce, TFF's default) or `auto`: the one "
    'scripts.benchmark measured faster for --task on the worker\'s CPU path '
    '(TF_ENABLE_ONEDNN_OPTS), else reduce (tff_partial/training/client_loop.py). '
    'Same steps in the same order.')


def client_loop_name(task_name: Optional[str] = None) -> str:
  """`iterator` or `reduce`: --client_loop with `auto` resolved for the task."""
  return client_loop.resolve(CLIENT_LOOP.value, task_name or TASK.value)


def loop_implementation(task_name: Optional[str] = None) -> 'tff.learning.LoopImplementation':
  """The `tff.learning.LoopImplementation` of --client_loop for the task."""
  return client_loop.loop_implementation(CLIENT_LOOP.value, task_name or TASK.value)


def _define_optimizer_flags(prefix: str, default: str, lr: float):
  return (
      flags.DEFINE_enum(f'{prefix}_optimizer', default, OPTIMIZERS,
                        f'{prefix.capitalize()} optimizer (tff.learning.optimizers).'),
      flags.DEFINE_float(f'{prefix}_learning_rate', lr, f'{prefix.capitalize()} learning rate.'),
      flags.DEFINE_float(f'{prefix}_momentum', 0.9,
                         f'{prefix.capitalize()} momentum for sgdm.'),
  )


_CLIENT_OPT = _define_optimizer_flags('client', 'sgd', 0.1)
_SERVER_OPT = _define_optimizer_flags('server', 'sgd', 1.0)


def _build_optimizer(prefix, flag_triple) -> tff.learning.optimizers.Optimizer:
  name, lr_flag, momentum_flag = (f.value for f in flag_triple)
  if lr_flag <= 0:
    raise FlagError(f'--{prefix}_learning_rate={lr_flag} must be > 0')
  if name == 'sgd':
    return tff.learning.optimizers.build_sgdm(learning_rate=lr_flag)
  if name == 'sgdm':
    return tff.learning.optimizers.build_sgdm(learning_rate=lr_flag, momentum=momentum_flag)
  if name == 'adam':
    return tff.learning.optimizers.build_adam(learning_rate=lr_flag)
  if name == 'adagrad':
    return tff.learning.optimizers.build_adagrad(learning_rate=lr_flag)
  if name == 'yogi':
    return tff.learning.optimizers.build_yogi(learning_rate=lr_flag)
  raise FlagError(f'--{prefix}_optimizer={name!r}; valid values: {", ".join(OPTIMIZERS)}')


def client_optimizer() -> tff.learning.optimizers.Optimizer:
  return _build_optimizer('client', _CLIENT_OPT)


def server_optimizer() -> tff.learning.optimizers.Optimizer:
  return _build_optimizer('server', _SERVER_OPT)


# --- the run ---------------------------------------------------------------
TOTAL_ROUNDS = flags.DEFINE_integer('total_rounds', 10, 'Training rounds.')
CLIENTS_PER_ROUND = flags.DEFINE_integer('clients_per_round', 10, 'Clients sampled per round.')
SEED = flags.DEFINE_integer(
    'seed', 0, 'Seed of every random choice: model init, client sampling, '
    'shuffling, frozen weights, masks, keys.')
ROOT_OUTPUT_DIR = flags.DEFINE_string('root_output_dir', '/tmp/tff_partial', 'Root of run outputs.')
EXPERIMENT_NAME = flags.DEFINE_string('experiment_name', None, 'Run name; outputs go to <root_output_dir>/<experiment_name>/.')
ROUNDS_PER_EVAL = flags.DEFINE_integer('rounds_per_eval', 1, 'Evaluate on the test clients every this many rounds.')
OUTPUT_DIR = flags.DEFINE_string(
    'output_dir', None,
    'Where a reporting binary writes its results (scripts.benchmark: '
    'benchmark.json/.md; scripts.plot: PNGs, default the CSV folder).')
ROUNDS_PER_CHECKPOINT = flags.DEFINE_integer('rounds_per_checkpoint', 10, 'Checkpoint every this many rounds.')
DETERMINISTIC = flags.DEFINE_bool(
    'deterministic', True,
    "TensorFlow op determinism in this process and TFF's worker "
    '(TF_DETERMINISTIC_OPS=1): the same flags and --seed give bit-identical '
    'weights and metrics in any process, also across a kill and resume. '
    'Measured cost: within noise (CPU s per FedAvg round of emnist_cnn, 10 '
    'clients: 1.20-1.33 with vs 1.24-1.28 without, oneDNN on; 1.78-2.02 vs '
    '1.85-2.00, oneDNN off). --nodeterministic keeps TensorFlow\'s default.')


def check_positive(flag_holder) -> None:
  if flag_holder.value is None or flag_holder.value <= 0:
    raise FlagError(f'--{flag_holder.name}={flag_holder.value} must be a positive integer')


def client_specs() -> tuple[tff.simulation.baselines.ClientSpec, tff.simulation.baselines.ClientSpec]:
  """Train and eval client specs. Shuffling is done by the loop, seeded."""
  check_positive(CLIENT_EPOCHS)
  check_positive(CLIENT_BATCH_SIZE)
  # --client_max_batches is applied after preprocessing (create_task), not as
  # ClientSpec.max_elements, which counts raw elements (sentences for text).
  # --client_epoch_batching=per_epoch repeats the batches instead (create_task).
  train = tff.simulation.baselines.ClientSpec(
      num_epochs=1 if _batched_per_epoch() else CLIENT_EPOCHS.value,
      batch_size=CLIENT_BATCH_SIZE.value,
      shuffle_buffer_size=1,  # the training loop shuffles, seeded per round/client
  )
  evaluation = tff.simulation.baselines.ClientSpec(
      num_epochs=1, batch_size=128, shuffle_buffer_size=1)
  return train, evaluation


def task_hparams(task_name: str) -> dict:
  """This task's hyperparameters from its flags; rejects other tasks' flags."""
  spec = registry.get_spec(task_name)
  for flag_name, prefix in _TASK_HPARAM_FLAGS.items():
    flag = flags.FLAGS[flag_name]
    # `present` misses values set in code (absl flagsaver); a changed value counts too.
    if prefix != spec.flag_prefix and (flag.present or flag.value != flag.default):
      raise FlagError(
          f'--{flag_name} belongs to the {prefix}_* tasks and does not apply to '
          f'--task={task_name}')
  return {
      name: flags.FLAGS[f'{spec.flag_prefix}_{name}'].value
      for name in spec.hparams
  }


def create_task(task_name: Optional[str] = None, seed: Optional[int] = None) -> registry.Task:
  """Builds the task selected by the flags (clear `TaskError` on bad input)."""
  task_name = task_name or TASK.value
  train_spec, eval_spec = client_specs()
  task_seed = SEED.value if seed is None else seed
  task = registry.create_task(
      task_name,
      train_client_spec=train_spec,
      eval_client_spec=eval_spec,
      data_source=DATA_SOURCE.value,
      data_dir=DATA_DIR.value,
      cache_dir=CACHE_DIR.value,
      seed=task_seed,
      **task_hparams(task_name),
  )
  if EVAL_SPLIT.value == 'validation':
    task = task.with_validation_split(VALIDATION_FRACTION.value, task_seed)
  elif VALIDATION_FRACTION.present:
    raise FlagError('--validation_fraction applies only to --eval_split=validation')
  if _batched_per_epoch():
    task = task.with_batched_epochs(CLIENT_EPOCHS.value)
  return task.with_max_train_batches(CLIENT_MAX_ELEMENTS.value)
