r"""Trains a task with one of the package's methods: the training binary.

  python -m scripts.train --task=emnist_cnn --algorithm=fedavg \
      --data_source=leaf --data_dir=../shared/data/femnist_leaf_sample.tar.xz \
      --total_rounds=50 --clients_per_round=10 --experiment_name=femnist_fedavg

`--dry_run` builds everything, trains nothing, and prints the DESIGN.md JSON
object on the last line of stdout. Outputs of a run go to
`<root_output_dir>/<experiment_name>/`: metrics.csv, tensorboard/,
checkpoints/ (a restarted run resumes), flags.json, model_weights.npz,
final_eval.json.
"""

import json
import os
import sys

from absl import app
from absl import flags
from absl import logging

from scripts import flag_groups
from scripts import methods
from scripts import runtime_flags
from scripts.methods import aggregators
from tasks import registry
from tff_partial.bench import machine
from tff_partial.training import determinism
from tff_partial.training import loop
from tff_partial.training import method as method_lib
from tff_partial.training import resumable

# Importing the method modules defines their flag groups.
_METHOD_MODULES = methods.all_method_modules()

_ALGORITHM = flags.DEFINE_enum('algorithm', 'fedavg', methods.ALGORITHMS, 'Training method.')
_DRY_RUN = flags.DEFINE_bool(
    'dry_run', False, 'Build the process, train nothing, print the report JSON.')

# Flags that do not change what is computed (not compared on resume).
_NOT_SAVED = ('dry_run', 'root_output_dir', 'experiment_name', 'output_dir')


def _fail(message: str) -> None:
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def validate_training_flags() -> None:
  """Checks the training flags (rounds, method, aggregator); `FlagError` if bad.

  What `scripts.train` and `scripts.adapt --train_if_missing` both check.
  """
  for holder in (flag_groups.TOTAL_ROUNDS, flag_groups.CLIENTS_PER_ROUND,
                 flag_groups.ROUNDS_PER_EVAL, flag_groups.ROUNDS_PER_CHECKPOINT):
    flag_groups.check_positive(holder)
  algorithm = _ALGORITHM.value
  for name, module in _METHOD_MODULES.items():
    if name == algorithm:
      continue
    for flag_name in module.FLAG_NAMES:
      if flags.FLAGS[flag_name].present:
        raise flag_groups.FlagError(
            f'--{flag_name} belongs to --algorithm={name} and does not apply to '
            f'--algorithm={algorithm}')
  _METHOD_MODULES[algorithm].validate_flags()
  aggregators.validate_flags(algorithm)


def check_model_flags() -> None:
  """Checks the method's layer flags against the task's model, loading no data.

  `FlagError` for a layer the model lacks (`--frozen_layers`, `--select_layer`)
  or more keys than a layer has, before `create_task` loads the data. Tasks
  registered without a `model_fn` are checked when they are built.
  """
  check = getattr(_METHOD_MODULES[_ALGORITHM.value], 'check_model', None)
  if check is None:
    return
  task_name = flag_groups.TASK.value
  keras_model_fn = registry.keras_model_fn(task_name, **flag_groups.task_hparams(task_name))
  if keras_model_fn is not None:
    check(keras_model_fn)


def _validate_common() -> None:
  validate_training_flags()
  if not _DRY_RUN.value and not flag_groups.EXPERIMENT_NAME.value:
    raise flag_groups.FlagError('--experiment_name is required to train (outputs go to '
                                '<root_output_dir>/<experiment_name>/)')
  name = flag_groups.EXPERIMENT_NAME.value
  if name and (os.path.isabs(name) or '..' in name.replace('\\', '/').split('/')):
    raise flag_groups.FlagError(
        f'--experiment_name={name!r} must be a relative path inside --root_output_dir '
        '(no leading / and no ..)')


def run_flags(attribute: str = 'value') -> dict:
  """The flags this run depends on (saved as flags.json beside the outputs).

  `attribute='default'` gives their defaults instead of their values.
  """
  values = {}
  for module_name, module_flags in flags.FLAGS.flags_by_module_dict().items():
    # absl files flags of the `python -m` main module under sys.argv[0].
    if module_name.startswith('scripts.') or module_name in ('__main__', sys.argv[0]):
      for flag in module_flags:
        if flag.name not in _NOT_SAVED:
          values[flag.name] = getattr(flag, attribute)
  # What --client_loop=auto chose (the same steps either way; recorded, not
  # compared on resume).
  values['client_loop_resolved'] = flag_groups.client_loop_name()
  if attribute == 'value' and not runtime_flags.WORKERS.value:
    # What --local_client_parallelism chose on this machine (speed only).
    values['local_client_parallelism_resolved'] = (
        runtime_flags.describe_local_parallelism())
  if attribute == 'value':
    # Where it computes: the two oneDNN paths round differently (recorded, not compared).
    values[resumable.CPU_PATH_KEY] = machine.cpu_path()
  return dict(sorted(values.items()))


def check_population(task: registry.Task) -> None:
  """FlagError if --clients_per_round exceeds the task's train clients."""
  if flag_groups.CLIENTS_PER_ROUND.value > task.population:
    raise flag_groups.FlagError(
        f'--clients_per_round={flag_groups.CLIENTS_PER_ROUND.value} is larger than '
        f'the population of --task={task.name} ({task.population} train clients)')


def build(task: registry.Task):
  """(BuiltMethod, AggregatorChoice) for the flags."""
  server_optimizer = flag_groups.server_optimizer()
  choice = aggregators.build(
      task, flag_groups.CLIENTS_PER_ROUND.value, flag_groups.TOTAL_ROUNDS.value,
      server_optimizer)
  ctx = method_lib.MethodContext(
      task=task,
      client_optimizer=flag_groups.client_optimizer(),
      server_optimizer=choice.server_optimizer or server_optimizer,
      model_aggregator=choice.factory,
      seed=flag_groups.SEED.value,
      clients_per_round=flag_groups.CLIENTS_PER_ROUND.value,
      total_rounds=flag_groups.TOTAL_ROUNDS.value,
      loop_implementation=flag_groups.loop_implementation(),
  )
  return _METHOD_MODULES[_ALGORITHM.value].build(ctx), choice


def train_built(task: registry.Task, built: method_lib.BuiltMethod,
                choice: aggregators.AggregatorChoice, output_dir: str, run_flags: dict,
                print_fn=print) -> loop.TrainingResult:
  """The one training path of the binaries: the shared loop with everything the
  aggregator choice needs (DP-FTRL's client order, epsilon, the privacy note).

  `scripts.train` and `scripts.adapt --train_if_missing` both train here, so a
  mechanism's guarantee (e.g. each client at most once per DP-FTRL epoch)
  comes with either binary.
  """
  return loop.run_training(
      task,
      built,
      total_rounds=flag_groups.TOTAL_ROUNDS.value,
      clients_per_round=flag_groups.CLIENTS_PER_ROUND.value,
      seed=flag_groups.SEED.value,
      output_dir=output_dir,
      rounds_per_eval=flag_groups.ROUNDS_PER_EVAL.value,
      rounds_per_checkpoint=flag_groups.ROUNDS_PER_CHECKPOINT.value,
      epsilon_fn=choice.epsilon_fn,
      client_indices_fn=choice.client_indices_fn,
      run_flags=run_flags,
      print_fn=print_fn,
      privacy_note=choice.privacy_note,
      flag_defaults=run_flags_defaults(run_flags),
      worker_restart_mb=runtime_flags.LOCAL_WORKER_RESTART_MB.value,
  )


def run_flags_defaults(saved_flags: dict) -> dict:
  """The defaults of the flags in `saved_flags` (see `loop.check_or_save_flags`)."""
  defaults = run_flags('default')
  return {k: defaults[k] for k in saved_flags if k in defaults}


def main(argv):
  if len(argv) > 1:
    _fail(f'unexpected arguments: {" ".join(argv[1:])}')
  try:
    _validate_common()
    # Before TFF starts its worker, which inherits the setting.
    determinism.configure(flag_groups.DETERMINISTIC.value)
    runtime_flags.configure_from_flags()
    check_model_flags()  # after TF's runtime settings: it builds a model
    task = flag_groups.create_task()
    check_population(task)
    built, choice = build(task)
  except (flag_groups.FlagError, registry.TaskError) as e:
    _fail(str(e))
  total_rounds = flag_groups.TOTAL_ROUNDS.value
  epsilon = choice.epsilon_fn(total_rounds) if choice.epsilon_fn else None
  if _DRY_RUN.value:
    report = method_lib.dry_run_report(built, task, epsilon)
    report.update(total_rounds=total_rounds,
                  clients_per_round=flag_groups.CLIENTS_PER_ROUND.value,
                  aggregator=flags.FLAGS.aggregator)
    if choice.privacy_note:
      report['privacy_note'] = choice.privacy_note
    print(json.dumps(report, sort_keys=True))
    return
  output_dir = os.path.join(flag_groups.ROOT_OUTPUT_DIR.value, flag_groups.EXPERIMENT_NAME.value)
  logging.info('task %s: %s', task.name, task.data_description)
  logging.info('writing to %s', output_dir)
  try:
    result = train_built(task, built, choice, output_dir, run_flags())
  except loop.RunConfigMismatchError as e:
    _fail(str(e))
  except runtime_flags.runtime.WorkerError as e:
    _fail(f'{e} (the run can be resumed from its last checkpoint: rerun with the same flags)')
  final = {'final_eval': result.final_eval, 'output_dir': output_dir}
  if choice.epsilon_fn is not None:
    final['epsilon'] = epsilon
    if choice.privacy_note:
      final['privacy_note'] = choice.privacy_note
  print(json.dumps(final, sort_keys=True))


if __name__ == '__main__':
  app.run(main)
