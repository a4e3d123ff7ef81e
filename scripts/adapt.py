r"""Local adaptation judged per participant (Yu, Bagdasaryan, Shmatikov 2020).

Takes the federated model of a `scripts.train` run (any algorithm and
aggregator: `<run_dir>/model_weights.npz` and `<run_dir>/flags.json`) and, for
each of N participants, measures on the participant's held-out data the
accuracy of the federated model, of a model the participant trains alone from
scratch, and of the federated model adapted to the participant by fine-tuning,
freeze-base, EWC and knowledge distillation (`tff_partial.adaptation`).

  python -m scripts.adapt --run_dir=/tmp/tff_partial/femnist_fedavg \
      --num_participants=40 --local_epochs=20 --adapt_epochs=5

With `--train_if_missing`, a run directory without `model_weights.npz` is
first trained, exactly as `scripts.train` would (its `--algorithm`,
`--aggregator`, method and training flags, its builder and the shared loop
`tff_partial.training.loop.run_training`), writing flags.json beside it.

Writes `<results_dir>/participants.csv` (one row per participant),
`<results_dir>/summary.json`, and prints the summary table; plot with
`python -m scripts.plot --csv=<results_dir>/participants.csv`.
"""

import hashlib
import json
import os
import random
import sys

from absl import app
from absl import flags
from absl import logging

from scripts import flag_groups
from scripts import runtime_flags
# scripts.train's flags (--algorithm, method and --aggregator flags) and its
# method builder serve --train_if_missing.
from scripts import train
from tasks import registry
from tff_partial.adaptation import evaluation
from tff_partial.adaptation import strategies
from tff_partial.adaptation import summary as summary_lib
from tff_partial.training import atomic
from tff_partial.training import determinism
from tff_partial.training import loop
from tff_partial.training import resumable

_RUN_DIR = flags.DEFINE_string(
    'run_dir', None, 'Directory of a scripts.train run (model_weights.npz, flags.json).')
_RESULTS_DIR = flags.DEFINE_string(
    'results_dir', None, 'Where to write the results; default <run_dir>/adaptation.')
_TRAIN_IF_MISSING = flags.DEFINE_bool(
    'train_if_missing', False,
    'Train a FedAvg model into --run_dir first when it has no model_weights.npz.')
_NUM_PARTICIPANTS = flags.DEFINE_integer(
    'num_participants', -1,
    'Participants to evaluate, sampled with --seed from the training clients (-1: all).')
_STRATEGIES = flags.DEFINE_list(
    'strategies', list(strategies.ADAPTATION_STRATEGIES),
    'Adaptation strategies: ' + ', '.join(strategies.ADAPTATION_STRATEGIES))
_LOCAL_EPOCHS = flags.DEFINE_integer('local_epochs', 50, 'Epochs of the from-scratch local model.')
_LOCAL_LR = flags.DEFINE_float('local_learning_rate', 0.1, 'SGD learning rate of the local model.')
_ADAPT_EPOCHS = flags.DEFINE_integer('adapt_epochs', 5, 'Epochs of every adaptation strategy.')
_ADAPT_LR = flags.DEFINE_float('adapt_learning_rate', 0.01, 'SGD learning rate of adaptation.')
_ADAPT_BATCH_SIZE = flags.DEFINE_integer('adapt_batch_size', 20, 'Batch size of local and adaptation training.')
_ADAPT_MOMENTUM = flags.DEFINE_float('adapt_momentum', 0.0, 'SGD momentum of local and adaptation training.')
_EWC_LAMBDA = flags.DEFINE_float('ewc_lambda', 1000.0, 'EWC penalty weight lambda.')
_FISHER_BATCH_SIZE = flags.DEFINE_integer(
    'fisher_batch_size', 1, 'Batch size of the empirical Fisher (1: per-example gradients).')
_FISHER_MAX_EXAMPLES = flags.DEFINE_integer(
    'fisher_max_examples', 500, 'At most this many examples for the Fisher (-1: all).')
_KD_ALPHA = flags.DEFINE_float('kd_alpha', 0.5, 'Knowledge distillation weight alpha of the KL term.')
_KD_TEMPERATURE = flags.DEFINE_float('kd_temperature', 2.0, 'Knowledge distillation temperature T.')
_REUSE_LOCAL_FROM = flags.DEFINE_string(
    'reuse_local_from', None,
    'participants.csv of an earlier scripts.adapt run on the same task, '
    'participants and local-training flags: take its local (from-scratch) '
    'accuracies instead of training the local models again (they do not depend '
    'on the federated model).')
_SPLIT = flags.DEFINE_enum(
    'split', 'auto', evaluation.SPLITS,
    "Participants' held-out data: their test split, the last --test_fraction of "
    'their examples in order, or auto (test split when the task has one).')
_TEST_FRACTION = flags.DEFINE_float('test_fraction', 0.2, 'Held-out share for --split=in_order.')
_METRIC = flags.DEFINE_enum(
    'metric', 'auto', ('auto',) + evaluation.METRICS,
    'How a participant judges a model: accuracy on its held-out data (--split), '
    'or class_ratio_accuracy: per-class accuracy on the global test set '
    "weighted by the participant's training class ratios, all of its examples "
    'training (Yu et al. 2020, sec. 4.2, CIFAR-10). auto: class_ratio_accuracy '
    'for Dirichlet-split tasks (cifar10_resnet18), else accuracy.')
_GLOBAL_TEST_PER_CLASS = flags.DEFINE_integer(
    'global_test_per_class', -1,
    'class_ratio_accuracy: judge on the first N test examples of each class '
    '(-1: the whole global test set).')

_OWN_FLAGS = (
    _RUN_DIR, _RESULTS_DIR, _TRAIN_IF_MISSING, _NUM_PARTICIPANTS, _STRATEGIES,
    _LOCAL_EPOCHS, _LOCAL_LR, _ADAPT_EPOCHS, _ADAPT_LR, _ADAPT_BATCH_SIZE,
    _ADAPT_MOMENTUM, _EWC_LAMBDA, _FISHER_BATCH_SIZE, _FISHER_MAX_EXAMPLES,
    _KD_ALPHA, _KD_TEMPERATURE, _REUSE_LOCAL_FROM, _SPLIT, _TEST_FRACTION,
    _METRIC, _GLOBAL_TEST_PER_CLASS)

# Flags a run's flags.json sets here (task and data), unless given explicitly.
_RUN_FLAGS = ('task', 'data_source', 'data_dir', 'cache_dir')


def load_run_flags(run_dir: str) -> dict:
  try:
    saved = resumable.read_flags(run_dir)
  except ValueError as e:
    raise flag_groups.FlagError(f'--run_dir: {e}') from e
  if saved is None:
    return {}
  if isinstance(saved.get('flags'), dict):
    saved = saved['flags']
  return saved


def data_flags(saved: dict) -> dict:
  """The run's flags that build its task and data: task, data, the task's own flags."""
  task = saved.get('task', flags.FLAGS.task)
  try:
    prefix = registry.get_spec(task).flag_prefix
  except registry.TaskError as e:
    raise flag_groups.FlagError(f'--run_dir flags.json: {e}') from e
  names = list(_RUN_FLAGS) + [
      n for n in saved if n.startswith(prefix + '_') and n in flags.FLAGS]
  return {name: saved[name] for name in names if name in saved}


def _apply_run_flags(saved: dict) -> None:
  """Takes task/data flags (and the task's hparam flags) from the run."""
  for name, value in data_flags(saved).items():
    flag = flags.FLAGS[name]
    explicit = flag.present or not flag.using_default_value
    if explicit and flag.value != value:
      raise flag_groups.FlagError(
          f'--{name}={flag.value!r} contradicts the run, which used '
          f'{name}={value!r} (drop --{name} or pick another --run_dir)')
    if not explicit:
      setattr(flags.FLAGS, name, value)


def _train(task, run_dir: str) -> None:
  """Trains into run_dir through scripts.train's one training path.

  Same validation, builder and `train.train_built` as `scripts.train`, so
  the aggregator's requirements come along (DP-FTRL's epoch sampler: each
  client at most once per epoch, as its epsilon assumes). `run` has checked
  the training and layer flags, set TF's runtime from the runtime flags and
  checked the population before.
  """
  built, choice = train.build(task)
  own = {holder.name for holder in _OWN_FLAGS}
  run_flags = {k: v for k, v in train.run_flags().items() if k not in own}
  train.train_built(task, built, choice, run_dir, run_flags, print_fn=logging.info)


def _participants(task, num: int, seed: int) -> list:
  ids = sorted(task.train_data.client_ids)
  if num is not None and 0 < num < len(ids):
    ids = sorted(random.Random(seed).sample(ids, num))
  return ids


# Flags the local models depend on; --reuse_local_from checks they match.
_LOCAL_FLAGS = ('task', 'local_epochs', 'local_learning_rate', 'adapt_batch_size',
                'adapt_momentum', 'split', 'test_fraction', 'seed', 'metric',
                'global_test_per_class')


def _reused_local(path: str, data_seed: int) -> dict:
  """participant -> local accuracy from an earlier run's CSV (validated).

  The earlier adaptation must have had the same participants' data: the same
  flags of the local models and the same training seed of the data (`data_seed`).
  """
  if not os.path.exists(path):
    raise flag_groups.FlagError(f'--reuse_local_from={path!r} does not exist')
  summary_path = os.path.join(os.path.dirname(path), 'summary.json')
  if os.path.exists(summary_path):
    with open(summary_path) as f:
      earlier = json.load(f)
    config = dict(earlier.get('config', {}), task=earlier.get('run', {}).get('task'))
    for name in _LOCAL_FLAGS:
      if name in config and config[name] != flags.FLAGS[name].value:
        raise flag_groups.FlagError(
            f'--reuse_local_from={path!r} was made with {name}={config[name]!r}, '
            f'this run has --{name}={flags.FLAGS[name].value!r}')
    earlier_seed = earlier.get('run', {}).get('data_seed')
    if earlier_seed is not None and earlier_seed != data_seed:
      raise flag_groups.FlagError(
          f'--reuse_local_from={path!r} adapted a run trained with seed={earlier_seed} '
          f'(its clients\' data); --run_dir was trained with seed={data_seed}')
  rows, _ = summary_lib.read_csv(path)
  return {r['participant']: r['local'] for r in rows}


def _metric(task) -> tuple:
  """(metric, split, global test set or None) for --metric and --split."""
  metric = _METRIC.value
  if metric == 'auto':
    metric = (evaluation.CLASS_RATIO_ACCURACY if task.dirichlet_split
              else evaluation.ACCURACY)
  if metric == evaluation.ACCURACY:
    return metric, _SPLIT.value, None
  if _SPLIT.value != 'auto':
    raise flag_groups.FlagError(
        f'--split={_SPLIT.value} does not apply to --metric={metric}: each '
        'participant trains on all of its examples and is judged on the global '
        'test set')
  per_class = _GLOBAL_TEST_PER_CLASS.value
  if per_class == 0 or per_class < -1:
    raise flag_groups.FlagError(
        f'--global_test_per_class={per_class} must be positive or -1 (all)')
  global_test = evaluation.global_test_data(task, None if per_class < 0 else per_class)
  return metric, evaluation.GLOBAL_TEST, global_test


def _progress(items):
  try:
    import tqdm  # pylint: disable=g-import-not-at-top
    return tqdm.tqdm(items, desc='participants', unit='participant')
  except ImportError:
    return items


def run(output_dir: str) -> dict:
  """Evaluates the participants; returns the summary (also written to disk)."""
  run_dir = _RUN_DIR.value
  if not run_dir:
    raise flag_groups.FlagError('--run_dir is required (a scripts.train output directory)')
  strategy_names = [s.strip() for s in _STRATEGIES.value if s.strip()]
  unknown = [s for s in strategy_names if s not in strategies.ADAPTATION_STRATEGIES]
  if unknown or not strategy_names:
    raise flag_groups.FlagError(
        f'--strategies={",".join(_STRATEGIES.value)}: give one or more of '
        + ', '.join(strategies.ADAPTATION_STRATEGIES))
  if _NUM_PARTICIPANTS.value == 0 or _NUM_PARTICIPANTS.value < -1:
    raise flag_groups.FlagError(
        f'--num_participants={_NUM_PARTICIPANTS.value} must be positive or -1 (all)')
  saved = load_run_flags(run_dir)
  _apply_run_flags(saved)
  # The data as the run had it: a task's client split (CIFAR-10's Dirichlet
  # split, synthetic data) derives from the training --seed; this binary's
  # own --seed samples the participants and seeds their local training.
  data_seed = saved.get('seed')
  if data_seed is None:
    data_seed = flag_groups.SEED.value
  weights_path = os.path.join(run_dir, resumable.WEIGHTS_FILE)
  needs_training = not os.path.exists(weights_path)
  if needs_training:
    if not _TRAIN_IF_MISSING.value:
      raise flag_groups.FlagError(
          f'--run_dir={run_dir!r} has no model_weights.npz; pass the directory '
          'of a finished scripts.train run, or add --train_if_missing')
    # As scripts.train does: the training flags, then TF's runtime (the
    # local worker's clients at once and threads, which set how it rounds;
    # its restarts; or --workers), then the layer flags (a model build),
    # all before the data loads.
    train.validate_training_flags()
    runtime_flags.configure_from_flags()
    train.check_model_flags()
  task = flag_groups.create_task(seed=data_seed)
  if needs_training:
    train.check_population(task)
    _train(task, run_dir)
    saved = load_run_flags(run_dir) or saved
  federated_weights = loop.read_model_weights(weights_path)
  metric, split, global_test = _metric(task)

  def config(epochs, lr):
    return strategies.TrainConfig(
        epochs=epochs, learning_rate=lr, batch_size=_ADAPT_BATCH_SIZE.value,
        momentum=_ADAPT_MOMENTUM.value)

  try:
    evaluator = evaluation.ParticipantEvaluator(
        task, federated_weights,
        local_config=config(_LOCAL_EPOCHS.value, _LOCAL_LR.value),
        adapt_config=config(_ADAPT_EPOCHS.value, _ADAPT_LR.value),
        strategy_config=strategies.StrategyConfig(
            ewc_lambda=_EWC_LAMBDA.value, kd_alpha=_KD_ALPHA.value,
            kd_temperature=_KD_TEMPERATURE.value),
        strategy_names=strategy_names,
        fisher_batch_size=_FISHER_BATCH_SIZE.value,
        fisher_max_examples=(None if _FISHER_MAX_EXAMPLES.value < 0
                             else _FISHER_MAX_EXAMPLES.value),
        seed=flag_groups.SEED.value, metric=metric, global_test=global_test)
  except ValueError as e:
    raise flag_groups.FlagError(str(e)) from e

  os.makedirs(output_dir, exist_ok=True)
  ids = _participants(task, _NUM_PARTICIPANTS.value, flag_groups.SEED.value)
  logging.info('Adapting %s (%s) on %d participants of %s',
               run_dir, saved.get('aggregator', 'mean'), len(ids), task.name)
  csv_path = os.path.join(output_dir, 'participants.csv')
  reused = (_reused_local(_REUSE_LOCAL_FROM.value, data_seed)
            if _REUSE_LOCAL_FROM.value else None)
  if reused is not None and set(ids) - set(reused):
    raise flag_groups.FlagError(
        f'--reuse_local_from={_REUSE_LOCAL_FROM.value!r} lacks participants '
        f'{sorted(set(ids) - set(reused))[:5]}...; use the same --num_participants and --seed')
  run_info = {
      'run_dir': os.path.abspath(run_dir),
      'task': task.name,
      'data_source': task.data_source,
      'algorithm': saved.get('algorithm', 'fedavg'),
      'aggregator': saved.get('aggregator', 'mean'),
      'noise_multiplier': saved.get('noise_multiplier'),
      'data_seed': data_seed,
  }
  config = {
      name: flags.FLAGS[name].value for name in (
          'local_epochs', 'local_learning_rate', 'adapt_epochs',
          'adapt_learning_rate', 'adapt_batch_size', 'adapt_momentum',
          'ewc_lambda', 'fisher_batch_size', 'fisher_max_examples', 'kd_alpha',
          'kd_temperature', 'split', 'test_fraction', 'seed', 'reuse_local_from',
          'metric', 'global_test_per_class')}
  finished = _resume(output_dir, csv_path, dict(
      run=run_info, config=config, participants=ids,
      columns=list(evaluator.columns), weights_sha256=_sha256(weights_path)))
  rows = []
  for index, client_id in enumerate(_progress(ids)):
    if client_id in finished:
      rows.append(finished[client_id])
      continue
    try:
      data = evaluation.participant_data(
          task, client_id, split=split, test_fraction=_TEST_FRACTION.value)
    except ValueError as e:  # e.g. no examples: reported, not fatal
      logging.warning('skipping participant %s: %s', client_id, e)
      continue
    rows.append(evaluator.evaluate(
        data, participant_index=index,
        local_accuracy=None if reused is None else reused[client_id]))
    summary_lib.write_csv(csv_path, rows, evaluator.columns)  # atomic: a kill keeps the rows so far
  result = summary_lib.summarize(rows, strategy_names)
  result['run'] = run_info
  result['config'] = config
  result['metric'] = metric  # --metric=auto resolved
  with atomic.atomic_write(os.path.join(output_dir, 'summary.json')) as f:
    json.dump(result, f, indent=2)
  return result


_RESUME_FILE = 'participants.json'


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  return digest.hexdigest()


def _resume(output_dir: str, csv_path: str, key: dict) -> dict:
  """participant -> finished row of an interrupted run with the same `key`.

  `key` (run, flags, participants, columns, the model's hash) is saved as
  participants.json beside participants.csv; a results dir that holds rows
  of another adaptation is refused rather than mixed.
  """
  key_path = os.path.join(output_dir, _RESUME_FILE)
  key = json.loads(json.dumps(key))  # as it reads back from the file
  if os.path.exists(csv_path):
    saved = None
    if os.path.exists(key_path):
      with open(key_path) as f:
        saved = json.load(f)
    if saved != key:
      raise flag_groups.FlagError(
          f'--results_dir={output_dir!r} holds participants.csv of another '
          'adaptation (other run, model, participants or flags); use another '
          '--results_dir, or the same flags to resume it')
    rows, _ = summary_lib.read_csv(csv_path)
    if rows:
      logging.info('Resuming: %d participants already in %s', len(rows), csv_path)
    return {r['participant']: r for r in rows}
  with atomic.atomic_write(key_path) as f:
    json.dump(key, f, indent=2)
  return {}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  output_dir = _RESULTS_DIR.value or os.path.join(_RUN_DIR.value or '.', 'adaptation')
  # Before TFF starts its worker (--train_if_missing), which inherits it.
  determinism.configure(flag_groups.DETERMINISTIC.value)
  try:
    result = run(output_dir)
  except (flag_groups.FlagError, registry.TaskError) as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  print(summary_lib.format_table(result))
  print(f'wrote {os.path.join(output_dir, "participants.csv")} and summary.json')


if __name__ == '__main__':
  app.run(main)
