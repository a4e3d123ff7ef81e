r"""How often PVT runs trained each variable, against what their scheme predicts.

  python -m scripts.pvt_coverage \
      --runs=outputs/sweeps/pvt_cifar10/runs/pvt_pcpr+pvt_freeze_fraction=0.9 \
      --per_variable

Each item of `--runs` is one `scripts.train --algorithm=pvt` run directory, or
a directory of such runs (a sweep's `runs/<config>`: every `seed_*` in it),
reported as one group (means over its runs). From each run's `metrics.csv`
(`aggregator/clients_per_variable`, the exact number of clients that trained
each variable every round) and `flags.json`, it prints a Markdown table of the
freezable variables (`tff_partial.masks.coverage`): clients per round that
trained a variable, the share of rounds in which nobody did, its staleness
(rounds since its last update) and the longest gap, each observed and as the
scheme predicts (`expected` in brackets). This is the "why" of PVT Tables 5-6
(Yang et al.): more clients per round shrink the untrained share
`(1 - p)^C` of per-client-per-round masks; more local steps do not.

The variables' names and types come from the run's task model, built on
synthetic data with the run's task flags (no data is read).
"""

import json
import os
import sys

from absl import app
from absl import flags
import numpy as np
import tensorflow_federated as tff

from scripts.methods import pvt
from tasks import registry
from tff_partial.masks import coverage
from tff_partial.masks import schemes
from tff_partial.masks import variable_types
from tff_partial.training import atomic
from tff_partial.training import resumable

_RUNS = flags.DEFINE_list(
    'runs', None, 'PVT run directories, or directories of seed_* runs (one group each).')
_PER_VARIABLE = flags.DEFINE_bool(
    'per_variable', False, 'Also print one table per group with a row per variable.')
_OUTPUT = flags.DEFINE_string(
    'output', None, 'Also write the Markdown to this file (replaced whole).')

# Flags of a run that must agree within a group.
_GROUP_KEYS = ('task', 'pvt_scheme', 'pvt_freeze_fraction', 'pvt_freeze_matrices_first',
               'clients_per_round')


class UsageError(ValueError):
  """Bad input, said in one line naming the flag or the directory."""


def _load_flags(run_dir: str) -> dict:
  try:
    saved = resumable.read_flags(run_dir)
  except ValueError as e:
    raise UsageError(f'--runs: {e}') from e
  if saved is None:
    raise UsageError(f'--runs: {run_dir} has no {resumable.FLAGS_FILE}: not a scripts.train run')
  if saved.get('algorithm') != 'pvt':
    raise UsageError(
        f'--runs: {run_dir} is an --algorithm={saved.get("algorithm")} run; this '
        'reports --algorithm=pvt runs only')
  return saved


def _group_dirs(item: str) -> list:
  if not os.path.isdir(item):
    raise UsageError(f'--runs: {item} is not a directory')
  if os.path.exists(os.path.join(item, resumable.FLAGS_FILE)):
    return [item]
  seeds = sorted(d for d in os.listdir(item) if d.startswith('seed_'))
  if not seeds:
    raise UsageError(f'--runs: {item} is neither a run directory nor one of seed_* runs')
  return [os.path.join(item, d) for d in seeds]


def _variables(saved: dict) -> list:
  """[(name, type)] of the run's trainable variables, in TFF order."""
  spec = registry.get_spec(saved['task'])
  hparams = {name: saved.get(f'{spec.flag_prefix}_{name}', default)
             for name, default in spec.hparams.items()}
  task = registry.create_task(
      saved['task'], data_source='synthetic', seed=0,
      train_client_spec=tff.simulation.baselines.ClientSpec(num_epochs=1, batch_size=1),
      **hparams)
  pvt.register_task_layers()
  return [(name, kind) for name, _, kind, _ in variable_types.describe(task.keras_model_fn())]


def _sampler(saved: dict, types) -> schemes.MaskSampler:
  return schemes.MaskSampler(
      types, saved['pvt_scheme'], saved['pvt_freeze_fraction'], seed=saved.get('seed', 0),
      freeze_matrices_first=saved.get('pvt_freeze_matrices_first', False))


def _group(item: str) -> dict:
  """Observed (mean over the runs) and expected coverage of one --runs item."""
  dirs = _group_dirs(item)
  saved = [_load_flags(d) for d in dirs]
  for key in _GROUP_KEYS:
    values = {json.dumps(s.get(key)) for s in saved}
    if len(values) > 1:
      raise UsageError(f'--runs: the runs in {item} differ in --{key} ({sorted(values)})')
  variables = _variables(saved[0])
  types = [kind for _, kind in variables]
  observed, expected, probabilities, rounds = [], [], [], []
  first_sampler = None  # the group's freezable indices and frozen count (same in every run)
  for d, run_flags in zip(dirs, saved):
    run_rounds, counts = coverage.read_counts(os.path.join(d, resumable.METRICS_FILE))
    if counts.shape[1] != len(variables):
      raise UsageError(
          f'--runs: {d} counts {counts.shape[1]} variables, its task model has {len(variables)}')
    observed.append(coverage.observed(counts))
    rounds.append(int(run_rounds[-1]))
    # Per run: a `fixed` mask depends on the run's seed.
    sampler = _sampler(run_flags, types)
    if first_sampler is None:
      first_sampler = sampler
    p = sampler.trained_probability()
    probabilities.append(p)
    expected.append(coverage.expected(p, run_flags['clients_per_round'],
                                      run_flags['pvt_scheme']))
  return {
      'item': item, 'flags': saved[0], 'variables': variables,
      'sampler': first_sampler, 'trained_probability': np.mean(probabilities, axis=0),
      'rounds': rounds, 'observed': observed, 'expected': expected,
  }


def _mean(coverages, field):
  """Mean over the group's runs of one `Coverage` field (per variable)."""
  return np.mean([getattr(c, field) for c in coverages], axis=0)


def _fmt(value, digits=2):
  return '∞' if np.isinf(value) else f'{value:.{digits}f}'


def group_row(g: dict) -> str:
  """One Markdown row over the group's freezable variables."""
  idx = g['sampler'].freezable
  obs, exp = g['observed'], g['expected']
  cells = [
      os.path.basename(os.path.normpath(g['item'])),
      f'{len(obs)} x {min(g["rounds"])}' + ('' if len(set(g['rounds'])) == 1
                                            else f'-{max(g["rounds"])}'),
      str(g['flags']['clients_per_round']),
      f'{g["flags"]["pvt_scheme"]} {g["flags"]["pvt_freeze_fraction"]}',
      f'{g["sampler"].num_frozen} of {len(idx)}',
  ]
  for field, digits in (('mean_clients', 2), ('untrained_share', 3), ('mean_staleness', 2)):
    cells.append(f'{_fmt(np.mean(_mean(obs, field)[idx]), digits)} '
                 f'({_fmt(np.mean(_mean(exp, field)[idx]), digits)})')
  cells.append(f'{int(np.max([o.longest_gap[idx].max() for o in obs]))}')
  return '| ' + ' | '.join(cells) + ' |'


GROUP_HEADER = (
    '| runs | seeds x rounds | clients per round | scheme | frozen per client '
    '| clients per round training a freezable variable (expected) '
    '| rounds nobody trained it (expected) | staleness, rounds (expected) '
    '| longest gap, rounds |\n|---|---|---|---|---|---|---|---|---|')


def variable_table(g: dict) -> str:
  obs, exp = g['observed'], g['expected']
  p = g['trained_probability']
  lines = [f'{os.path.basename(os.path.normpath(g["item"]))}: per variable (mean over '
           f'{len(obs)} run(s))', '',
           '| variable | type | p(client trains it) | clients per round (expected) '
           '| rounds nobody trained it (expected) | staleness (expected) | longest gap |',
           '|---|---|---|---|---|---|---|']
  for i, (name, kind) in enumerate(g['variables']):
    lines.append(
        f'| {name} | {kind} | {p[i]:.3f} '
        f'| {_mean(obs, "mean_clients")[i]:.2f} ({_mean(exp, "mean_clients")[i]:.2f}) '
        f'| {_mean(obs, "untrained_share")[i]:.3f} ({_mean(exp, "untrained_share")[i]:.3f}) '
        f'| {_fmt(_mean(obs, "mean_staleness")[i])} ({_fmt(_mean(exp, "mean_staleness")[i])}) '
        f'| {int(np.max([o.longest_gap[i] for o in obs]))} |')
  return '\n'.join(lines)


def report(items) -> str:
  groups = [_group(item) for item in items]
  parts = [GROUP_HEADER] + [group_row(g) for g in groups]
  text = '\n'.join(parts)
  if _PER_VARIABLE.value:
    text += '\n\n' + '\n\n'.join(variable_table(g) for g in groups)
  return text + '\n'


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if not _RUNS.value:
    print('error: --runs is required (PVT run directories, or directories of seed_* runs)',
          file=sys.stderr)
    return 2
  try:
    text = report(_RUNS.value)
  except (UsageError, coverage.CoverageError, registry.TaskError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  print(text, end='')
  if _OUTPUT.value:
    with atomic.atomic_write(_OUTPUT.value) as f:
      f.write(text)
  return 0


if __name__ == '__main__':
  app.run(main)
