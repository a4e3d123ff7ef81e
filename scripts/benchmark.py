r"""Benchmarks methods side by side, on the same clients and seeds.

  python -m scripts.benchmark --task=emnist_cnn_gn --data_source=leaf \
      --data_dir=../shared/data/femnist_leaf_sample.tar.xz \
      --clients_per_round=10 --benchmark_rounds=6 --output_dir=/tmp/bench

This binary turns flags into configurations and calls the measuring library
`tff_partial.bench` (one concern per module: `configs` presets, `cohorts`
client data paths, `rounds` interleaved round timing, `references` the
centralized Keras limit and the tf.function floor, `client_memory` the
memory column, `scaling` cost against cohort size, `report` the tables,
`machine` the report header). See docs/benchmarks.md for what each column
measures.

Configurations are (name, algorithm, flag overrides): `tff_fedavg` is TFF's
`build_weighted_fed_avg` called with its defaults and fed by TFF's own client
data path; every other algorithm is built with its method module's
`build(ctx)` (`scripts/methods/<algorithm>.py`) under `flagsaver` with the
overrides, fed by the training loop's client path. A method whose module
still says "not implemented" is skipped with a note. Overrides
`worker_max_concurrent_calls`, `worker_intra_op_threads` and
`worker_inter_op_threads` run a configuration on a local TFF worker of its
own with those settings (`tff_partial.bench.worker_settings`).

`--benchmark_select_buckets=1,10,100,1000` instead times federated select
against a broadcast of the same payload (`tff_partial.select.bench`).
`--benchmark_cohorts=10,50,100,200` instead reports seconds per round against
clients per round for each configuration, with a least-squares line.
"""

import contextlib
import dataclasses
import os
import re
import sys

from absl import app
from absl import flags
from absl import logging
from absl.testing import flagsaver
import tensorflow_federated as tff

from scripts import flag_groups
from scripts import runtime_flags
from scripts.methods import aggregators
from scripts.methods import fedavg
from scripts.methods import fedpt
from scripts.methods import pvt
from scripts.methods import select
from tff_partial.bench import client_memory as client_memory_lib
from tff_partial.bench import cohorts as cohorts_lib
from tff_partial.bench import configs as configs_lib
from tff_partial.bench import machine
from tff_partial.bench import references
from tff_partial.bench import report as report_lib
from tff_partial.bench import rounds
from tff_partial.bench import scaling
from tff_partial.bench import worker_settings
from tff_partial import runtime
from tff_partial.select import bench as select_bench
from tff_partial.training import loop
from tff_partial.training import method

_METHOD_MODULES = {'fedavg': fedavg, 'fedpt': fedpt, 'pvt': pvt, 'select': select}
_ALGORITHMS = (configs_lib.TFF_FEDAVG, *_METHOD_MODULES)

_CONFIGS = flags.DEFINE_list(
    'benchmark_configs', None,
    'Preset configurations to run; default: the presets of --task. Presets: '
    + ', '.join(configs_lib.PRESETS))
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
_REFERENCES = flags.DEFINE_list(
    'benchmark_references', list(references.NAMES),
    'Centralized references run interleaved with the configurations: '
    + ', '.join(references.ALL_NAMES) + f' ({references.LIMIT} is the limit every '
    '"vs limit" ratio divides by); empty: none.')
_KERAS = flags.DEFINE_bool(
    'benchmark_keras', True, 'Run the --benchmark_references (false: none).')
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
    'e.g. 1,10,100,1000; each is one round of select of '
    '--benchmark_select_keys rows per client against a broadcast of the same payload.')
_SELECT_IMPLEMENTATIONS = flags.DEFINE_list(
    'benchmark_select_implementations', list(select_bench.IMPLEMENTATIONS),
    'Select-vs-broadcast: implementations of select to time: '
    + ', '.join(select_bench.IMPLEMENTATIONS))
_SELECT_KEYS = flags.DEFINE_integer(
    'benchmark_select_keys', 1000, 'Select-vs-broadcast: rows each client needs.')
_SELECT_CLIENTS = flags.DEFINE_integer(
    'benchmark_select_clients', 50, 'Select-vs-broadcast: clients per round.')
_SELECT_ROW_DIM = flags.DEFINE_integer(
    'benchmark_select_row_dim', 96, 'Select-vs-broadcast: floats per row.')


class Skip(Exception):
  """A configuration cannot run (method not implemented, flags not defined)."""


def _flag_overrides(config: configs_lib.Config) -> dict:
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


def build_config(config: configs_lib.Config, ctx: method.MethodContext) -> method.BuiltMethod:
  """Builds one configuration; raises Skip for methods not implemented yet.

  The configuration's flag overrides hold while it is built, --client_loop
  included. `tff_fedavg` is TFF's FedAvg as a user calls it: the same builder
  as this package's FedAvg with TFF's default aggregator and TFF's default
  loop (dataset.reduce) unless the configuration sets --client_loop.
  """
  overrides = _flag_overrides(config)
  try:
    with flagsaver.flagsaver(**overrides):
      if config.algorithm == configs_lib.TFF_FEDAVG:
        loop_impl = (flag_groups.loop_implementation(ctx.task.name)
                     if 'client_loop' in overrides
                     else tff.learning.LoopImplementation.DATASET_REDUCE)
        built = fedavg.build(dataclasses.replace(
            ctx, model_aggregator=None, loop_implementation=loop_impl))
        return dataclasses.replace(built, name=configs_lib.TFF_FEDAVG)
      module = _METHOD_MODULES[config.algorithm]
      module.validate_flags()
      return module.build(dataclasses.replace(
          ctx, loop_implementation=flag_groups.loop_implementation(ctx.task.name)))
  except NotImplementedError as e:
    raise Skip(f'{config.algorithm} is not implemented yet ({e})') from e
  except flag_groups.FlagError as e:
    if _NOT_IMPLEMENTED.search(str(e)):
      raise Skip(str(e)) from e
    raise


def build_candidates(configs, task, ctx, seed) -> tuple[list, dict]:
  """(candidates, {name: reason skipped}) for the configurations.

  Overrides named in `worker_settings.KEYS` are not flags: they run the
  configuration on a local TFF worker of its own with those settings.
  """
  candidates, skipped, contexts = [], {}, {}
  for config in configs:
    try:
      settings, flag_overrides = worker_settings.split(config.overrides)
    except ValueError as e:
      raise flag_groups.FlagError(f'{config.name}: {e}') from None
    if settings and runtime_flags.WORKERS.value:
      raise flag_groups.FlagError(
          f'{config.name}: {", ".join(settings)} set a local worker; not with --workers')
    if (config.algorithm == configs_lib.TFF_FEDAVG and not settings
        and not runtime_flags.WORKERS.value):
      # TFF as a user runs it: on TFF's default worker settings, whatever
      # --local_client_parallelism gives this package's configurations.
      settings = {'worker_max_concurrent_calls': -1}
    try:
      built = build_config(dataclasses.replace(config, overrides=flag_overrides), ctx)
    except Skip as e:
      logging.warning('skipping %s: %s', config.name, e)
      skipped[config.name] = str(e)
      continue
    if config.algorithm == configs_lib.TFF_FEDAVG:
      inputs_fn = cohorts_lib.tff_inputs_fn(task)
    else:
      inputs_fn = cohorts_lib.package_inputs_fn(task, built, seed)
    context = None
    if settings:
      key = tuple(sorted(settings.items()))
      if key not in contexts:
        contexts[key] = worker_settings.local_context(**settings)
      context = contexts[key]
    candidates.append(rounds.Candidate(config.name, config.algorithm, built,
                                       inputs_fn, dict(config.overrides), context))
  return candidates, skipped


def select_vs_broadcast() -> dict:
  """Seconds of a select round against a broadcast round of the same payload."""
  rows = []
  for implementation in _SELECT_IMPLEMENTATIONS.value:
    if implementation not in select_bench.IMPLEMENTATIONS:
      raise flag_groups.FlagError(
          f'--benchmark_select_implementations: {implementation!r}; valid values: '
          + ', '.join(select_bench.IMPLEMENTATIONS))
  for bucket in _SELECT_BUCKETS.value:
    try:
      bucket_size = int(bucket)
    except ValueError:
      raise flag_groups.FlagError(
          f'--benchmark_select_buckets: {bucket!r} is not an integer') from None
    for implementation in _SELECT_IMPLEMENTATIONS.value:
      rows.append(select_bench.time_select_vs_broadcast(
          num_keys=_SELECT_KEYS.value, clients=_SELECT_CLIENTS.value,
          row_dim=_SELECT_ROW_DIM.value, bucket_size=bucket_size,
          implementation=implementation))
      logging.info('select vs broadcast: %s', rows[-1])
  return {'machine': machine.describe().header(), 'select_vs_broadcast': rows,
          'load_at_end': _load()}


def _load() -> str:
  return '/'.join(f'{x:.1f}' for x in machine.load_average())


def run(output_dir):
  """The benchmark selected by the flags; returns the report dict."""
  runtime_flags.configure_from_flags()
  if _SELECT_BUCKETS.value:
    report = select_vs_broadcast()
    report_lib.write(output_dir, report)
    return report
  task_name = flag_groups.TASK.value
  seed = flag_groups.SEED.value
  num_rounds, warmup = _ROUNDS.value, _WARMUP.value
  if num_rounds <= warmup:
    raise flag_groups.FlagError(
        f'--benchmark_rounds={num_rounds} must exceed --benchmark_warmup_rounds={warmup}')
  try:
    configs = configs_lib.select(task_name, _CONFIGS.value, _CUSTOM.value, _ALGORITHMS)
  except ValueError as e:
    raise flag_groups.FlagError(str(e)) from e
  reference_names = list(_REFERENCES.value) if _KERAS.value else []
  for name in reference_names:
    if name not in references.ALL_NAMES:
      raise flag_groups.FlagError(
          f'--benchmark_references: {name!r}; valid values: ' + ', '.join(references.ALL_NAMES))
  aggregators.validate_flags('fedavg')
  scaling_mode = _COHORTS.value is not None
  try:
    cohort_sizes = ([int(c) for c in _COHORTS.value] if scaling_mode
                    else [flag_groups.CLIENTS_PER_ROUND.value])
  except ValueError as e:
    raise flag_groups.FlagError(f'--benchmark_cohorts: {e}') from None
  if _LOCAL_WORKERS.value and (not scaling_mode or runtime_flags.WORKERS.value):
    raise flag_groups.FlagError(
        '--benchmark_local_workers needs --benchmark_cohorts and no --workers')
  for c in cohort_sizes:
    if c <= 0:
      raise flag_groups.FlagError(f'clients per round {c} must be positive')
  host = machine.describe()
  task = flag_groups.create_task(task_name)

  def make_ctx(cohort_size):
    server_opt = flag_groups.server_optimizer()
    choice = aggregators.build(task, cohort_size, num_rounds, server_opt)
    return method.MethodContext(
        task=task, client_optimizer=flag_groups.client_optimizer(),
        server_optimizer=choice.server_optimizer or server_opt,
        model_aggregator=choice.factory, seed=seed,
        clients_per_round=cohort_size, total_rounds=num_rounds,
        loop_implementation=flag_groups.loop_implementation(task_name))

  report = {
      'task': task_name, 'machine': host.header(), 'machine_info': dataclasses.asdict(host),
      'data': f'{task.data_source}: {task.data_description or task.population}',
      'population': task.population, 'clients_per_round': cohort_sizes[0],
      'rounds': num_rounds, 'warmup_rounds': warmup, 'seed': seed,
      'client_batch_size': flag_groups.CLIENT_BATCH_SIZE.value,
      'client_epochs': flag_groups.CLIENT_EPOCHS.value,
      'client_epoch_batching': flag_groups.CLIENT_EPOCH_BATCHING.value,
      'client_max_batches': flag_groups.CLIENT_MAX_ELEMENTS.value,
      'client_loop': f'--client_loop={flag_groups.CLIENT_LOOP.value} -> '
                     f'{flag_groups.client_loop_name(task_name)}',
      'runtime': ('workers ' + ','.join(runtime_flags.WORKERS.value)
                  if runtime_flags.WORKERS.value else
                  'TFF local C++ runtime; --local_client_parallelism='
                  + runtime_flags.describe_local_parallelism()
                  + ' (tff_fedavg* on TFF\'s default worker)'),
      'method_note': report_lib.METHOD_NOTE,
  }
  if scaling_mode:
    report['cohorts'] = cohort_sizes
    sweep_workers = (runtime.local_workers(_LOCAL_WORKERS.value) if _LOCAL_WORKERS.value
                     else contextlib.nullcontext(runtime.LocalWorkers()))
    with sweep_workers as workers:
      if workers:
        runtime_flags.configure(workers.addresses)
        report['runtime'] = (f'{len(workers)} local workers, at most '
                             f'{runtime_flags.WORKER_MAX_CLIENTS_PER_SUBROUND.value or "all"} '
                             'clients per sub-round')

      def after_size(scaling_so_far, usage):
        for key, value in usage.items():
          report.setdefault(key, []).append(value)
        report['scaling'] = scaling_so_far
        report_lib.write(output_dir, report)  # what finished survives a kill

      report['scaling'] = scaling.sweep(
          lambda size: build_candidates(configs, task, make_ctx(size), seed),
          task, cohort_sizes, seed=seed, rounds=num_rounds, warmup=warmup,
          usage_fn=lambda: runtime.ResourceUsage(workers), after_size=after_size)
  else:
    size = cohort_sizes[0]
    round_cohorts = cohorts_lib.sample_cohorts(
        list(task.train_data.client_ids), seed, num_rounds, size)
    candidates, skipped = build_candidates(configs, task, make_ctx(size), seed)
    memory = (client_memory_lib.ClientMemory(
        task, flag_groups.CLIENT_BATCH_SIZE.value, seed, min(_MEMORY_CLIENTS.value, size))
              if _MEMORY.value else None)

    def finish(candidate, state, row):
      if memory is not None:
        row.update(memory.measure(candidate.built))
      if _EVAL.value:
        weights = candidate.built.process.get_model_weights(state)
        row['accuracy'] = float(loop.evaluate(task, weights)['accuracy'])

    refs = references.make_references(
        reference_names, task, seed, flags.FLAGS.client_learning_rate,
        cohorts_lib.ExampleCounter(task))
    rows, reference_rows = rounds.run_interleaved(
        candidates, task, round_cohorts, seed=seed, warmup=warmup,
        empty_rounds=_EMPTY_ROUNDS.value, finish_fn=finish, references=refs)
    by_name = {r['name']: r for r in rows}
    rows = [by_name.get(c.name) or {'name': c.name, 'algorithm': c.algorithm,
                                    'skipped': skipped[c.name]} for c in configs]
    report_lib.add_ratios(rows, reference_rows)
    report.update(rows=rows, references=reference_rows)
  report['load_at_end'] = _load()
  report_lib.write(output_dir, report)
  return report


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  try:
    report = run(flag_groups.OUTPUT_DIR.value)
  except (flag_groups.FlagError, ValueError) as e:
    sys.exit(f'error: {e}')
  print(report_lib.report_markdown(report))


if __name__ == '__main__':
  app.run(main)
