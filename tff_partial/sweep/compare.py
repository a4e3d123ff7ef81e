"""Arms and gaps of published sweep summaries, compared across sweeps.

A summary directory (`scripts.sweep --summary_dir=docs/results/<name>`) holds
`runs.csv` (each finished run's final test metrics) and `curves/` (each run's
metrics.csv). Issue 16's verdicts compare one factor across sweeps: an arm
(e.g. PVT at 90% frozen) against a reference arm (FedAvg) of the same sweep,
and that gap against the gap of a sweep that differs in one flag (2x clients,
2x local steps). This module computes those numbers from the files, so that
a results page can say where each came from (`scripts.sweep_compare`).

Definitions (in accuracy points, i.e. percent; with `metric='loss'` in nats
of test loss):
- an arm's value per seed: its final test accuracy, or its mean evaluation
  accuracy over the rounds of a window (e.g. 151-200; the evaluations logged
  in those rounds), which is less noisy than one round;
- mean ± sample standard deviation over seeds;
- gap = mean(arm) - mean(reference), with the standard error of a difference
  of two independent means, sqrt(s_a^2 / n_a + s_r^2 / n_r). It ignores the
  pairing: two arms of one sweep run with the same seed and the same clients
  per round meet the same clients in the same rounds (the loop samples them
  as a function of (seed, round)), so their seeds are paired, and this s.e.
  is too large when an arm's seeds move with the reference's and too small
  when they move apart;
- paired by seed (`paired_seeds`): arm - reference on each seed that both
  ran, their mean, and the s.e. of that mean, std(d) / sqrt(n); it shows
  whether every seed points the same way;
- the change of a gap (or of an arm) between two sweeps: the difference, with
  sqrt(se_1^2 + se_2^2).
The "sweeps" compared may also be groups of configs of one sweep that differ
in one factor and carry it in their names (`fedavg_z0`, `fedavg_z1`, ...):
`suffixes` gives each label the suffix its configs' names end with.

A sweep still running has no summary: `running=True` reads a sweep (or bank)
directory instead, each run's own `runs/<config>/seed_<s>/metrics.csv`,
finished or not. The directory's manifest (`sweep.json`) says which configs
and seeds the sweep has: a seed that has not started stops the comparison
rather than leaving its arm with fewer seeds, and a run directory of a seed
outside the spec is not read. It compares windows only, and only a window
that every run has logged to its last round, so that no arm is averaged over
fewer rounds than another.
Hand-written: a few means and square roots over CSV files; no library
computes gaps of this layout.
"""

import csv
import dataclasses
import math
import os
from typing import Mapping, Optional, Sequence, Tuple

import numpy as np

from tff_partial.sweep import manifest
from tff_partial.sweep import plan
from tff_partial.sweep import spec as spec_lib
from tff_partial.sweep import summary
from tff_partial.training import resumable

RUNS_CSV = 'runs.csv'
CURVES_DIR = 'curves'
# The metrics compared: accuracy in points, the loss in nats, shown as the
# summaries show them (`summary.metric_scale`, `summary.metric_digits`).
METRICS = ('accuracy', 'loss')


class CompareError(ValueError):
  """A summary directory lacks what the comparison needs."""


@dataclasses.dataclass(frozen=True)
class Estimate:
  """A mean with its standard error (nan when it cannot be estimated)."""

  mean: float
  se: float
  digits: int = 2

  def text(self) -> str:
    se = 'n/a' if math.isnan(self.se) else f'{self.se:.{self.digits}f}'
    return f'{self.mean:+.{self.digits}f} (s.e. {se})'


@dataclasses.dataclass(frozen=True)
class Arm:
  """One config of one summary: per-seed values (accuracy points, or nats of loss)."""

  config: str
  seeds: Tuple[int, ...]
  values: np.ndarray
  digits: int = 2

  @property
  def mean(self) -> float:
    return float(np.mean(self.values))

  @property
  def std(self) -> float:
    return float(np.std(self.values, ddof=1)) if len(self.values) > 1 else math.nan

  def se(self) -> float:
    return self.std / math.sqrt(len(self.values))

  def estimate(self) -> Estimate:
    return Estimate(self.mean, self.se(), self.digits)

  def text(self) -> str:
    std = 'n/a' if math.isnan(self.std) else f'{self.std:.{self.digits}f}'
    return f'{self.mean:.{self.digits}f} ± {std}'


def _read_csv(path: str) -> list:
  try:
    with open(path, newline='') as f:
      return list(csv.DictReader(f))
  except OSError as e:
    raise CompareError(f'cannot read {path}: {e.strerror}') from e


def _check_metric(metric: str) -> None:
  if metric not in METRICS:
    raise CompareError(f'metric {metric!r} is not one of ' + ', '.join(METRICS))


def _seeds(summary_dir: str, config: str, metric: str) -> dict:
  """seed -> final test `metric` of `config`'s runs in the summary's runs.csv."""
  all_rows = _read_csv(os.path.join(summary_dir, RUNS_CSV))
  rows = [r for r in all_rows if r['config'] == config]
  if not rows:
    configs = sorted({r['config'] for r in all_rows})
    raise CompareError(f'{summary_dir} has no finished run of config {config!r}; its configs: '
                       + ', '.join(configs))
  column = f'test_{metric}'
  if any(r.get(column) in (None, '', 'nan') for r in rows):
    raise CompareError(f'{os.path.join(summary_dir, RUNS_CSV)} has no {column} for every run '
                       f'of {config!r} (rewrite the summary with scripts.sweep --summary_only)')
  return {int(r['seed']): float(r[column]) for r in rows}


def _window_arm(config: str, paths: Mapping[int, str], window: Tuple[int, int], metric: str,
                *, must_reach: bool = False) -> Tuple[Arm, int]:
  """Per seed, the mean evaluation/<metric> over `window` of the CSV `paths[seed]`.

  Also returns the least last round the CSVs logged; `must_reach` refuses a
  CSV whose last round is before the window's end.
  """
  scale, digits = summary.metric_scale(metric)[0], summary.metric_digits(metric)
  first, last = window
  column = f'evaluation/{metric}'
  seeds = tuple(sorted(paths))
  values, reached = [], []
  for seed in seeds:
    path = paths[seed]
    try:
      rows = summary.read_metrics_csv(path)  # a round a resumed run logged twice: the last
    except OSError as e:
      raise CompareError(f'cannot read {path}: {e.strerror}') from e
    logged = int(rows[-1]['round_num']) if rows else 0
    if must_reach and logged < last:
      raise CompareError(f'{path} has reached round {logged}, before the end of window '
                         f'{first}-{last}: pick a window that ends by round {logged}, or wait')
    evaluated = [float(r[column]) for r in rows
                 if first <= int(r['round_num']) <= last and r.get(column)]
    if not evaluated:
      raise CompareError(f'{path} has no evaluation in rounds {first}-{last}')
    values.append(scale * float(np.mean(evaluated)))
    reached.append(logged)
  return Arm(config, seeds, np.array(values), digits), min(reached)


def read_arm(summary_dir: str, config: str,
             window: Optional[Tuple[int, int]] = None, metric: str = 'accuracy') -> Arm:
  """`config`'s final test `metric` per seed, or its mean over the rounds of `window`.

  window: (first, last) round, both included; the evaluations of
  `curves/<config>_seed<s>.csv` in those rounds are averaged per seed (of a
  round logged twice, by a run resumed from a checkpoint, the last).
  """
  _check_metric(metric)
  finals = _seeds(summary_dir, config, metric)
  seeds = tuple(sorted(finals))
  if window is None:
    scale, digits = summary.metric_scale(metric)[0], summary.metric_digits(metric)
    return Arm(config, seeds, scale * np.array([finals[s] for s in seeds]), digits)
  paths = {s: os.path.join(summary_dir, CURVES_DIR, f'{config}_seed{s}.csv') for s in seeds}
  return _window_arm(config, paths, window, metric)[0]


def _running_seeds(sweep_dir: str, config: str) -> dict:
  """seed -> metrics.csv of each run of `config` in a sweep directory, finished or not.

  The seeds of the directory's manifest, every one of them; without a
  manifest (a directory made by hand), the run directories found.
  """
  if not os.path.exists(os.path.join(sweep_dir, manifest.MANIFEST_FILE)):
    return _run_metrics_files(sweep_dir, config)
  spec = spec_lib.from_dict(manifest.read(sweep_dir)['spec'])
  configs = [c.name for c in spec.expand()]
  if config not in configs:
    raise CompareError(f'the sweep in {sweep_dir} has no config {config!r}; its configs: '
                       + ', '.join(configs))
  paths = _run_metrics_files(sweep_dir, config)
  missing = [s for s in spec.seeds if s not in paths]
  if missing:
    raise CompareError(
        f'{sweep_dir}: config {config!r} has no {resumable.METRICS_FILE} for seed(s) '
        f'{", ".join(map(str, missing))} of its sweep (seeds {", ".join(map(str, spec.seeds))}): '
        'compare once every seed has started')
  return {s: paths[s] for s in spec.seeds}


def _run_metrics_files(sweep_dir: str, config: str) -> dict:
  """seed -> metrics.csv of the `seed_<s>` directories of `config`; CompareError if none."""
  runs_dir = os.path.join(sweep_dir, plan.RUNS_DIR)
  config_dir = os.path.join(runs_dir, config)
  paths = {}
  if os.path.isdir(config_dir):
    for name in os.listdir(config_dir):
      path = os.path.join(config_dir, name, resumable.METRICS_FILE)
      prefix, _, seed = name.partition('_')
      if prefix == 'seed' and seed.isdigit() and os.path.exists(path):
        paths[int(seed)] = path
  if not paths:
    configs = sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else []
    raise CompareError(f'{sweep_dir} has no run of config {config!r} with a '
                       f'{resumable.METRICS_FILE}; its configs: ' + (', '.join(configs) or 'none')
                       + ' (--running reads a sweep directory, not a summary)')
  return paths


def read_running_arm(sweep_dir: str, config: str, window: Tuple[int, int],
                     metric: str = 'accuracy') -> Tuple[Arm, int]:
  """`config`'s mean over `window` per seed from a running sweep, and its least last round.

  Reads each run's `metrics.csv` in `sweep_dir/runs/<config>/`, finished or
  not, and refuses a window that a run has not logged to its last round.
  """
  _check_metric(metric)
  return _window_arm(config, _running_seeds(sweep_dir, config), window, metric, must_reach=True)


def gap(arm: Arm, reference: Arm) -> Estimate:
  """mean(arm) - mean(reference), with the s.e. of two independent means."""
  return Estimate(arm.mean - reference.mean, math.sqrt(arm.se() ** 2 + reference.se() ** 2),
                  arm.digits)


def paired(arm: Arm, reference: Arm) -> Arm:
  """arm - reference on each seed that both ran, as an Arm (its estimate: the paired gap)."""
  values = dict(zip(reference.seeds, reference.values))
  seeds = tuple(s for s in arm.seeds if s in values)
  if not seeds:
    raise CompareError(f'{arm.config} and {reference.config} share no seed to pair')
  diffs = [v - values[s] for s, v in zip(arm.seeds, arm.values) if s in values]
  return Arm(f'{arm.config} - {reference.config}', seeds, np.array(diffs), arm.digits)


def _paired_text(arm: Arm, reference: Arm) -> str:
  d = paired(arm, reference)
  return (f'{arm.config} ' + ' / '.join(f'{v:+.{d.digits}f}' for v in d.values)
          + f' (seeds {"/".join(str(s) for s in d.seeds)}: {d.estimate().text()}, '
          f'{int(np.sum(d.values < 0))} below, {int(np.sum(d.values > 0))} above)')


def change(before: Estimate, after: Estimate) -> Estimate:
  """after - before, two independent estimates."""
  return Estimate(after.mean - before.mean, math.sqrt(before.se ** 2 + after.se ** 2),
                  before.digits)


def table(sweeps: Sequence[Tuple[str, str]], reference: str, configs: Sequence[str],
          window: Optional[Tuple[int, int]] = None, *, metric: str = 'accuracy',
          suffixes: Optional[Mapping[str, str]] = None, running: bool = False,
          paired_seeds: bool = False) -> list:
  """Markdown lines comparing `configs` and their gaps to `reference` across `sweeps`.

  sweeps: (label, summary directory) pairs, the first being the base that the
  others' changes are measured from. One column per sweep at the end of the
  runs, and one per sweep over `window` if given.
  metric: 'accuracy' (points) or 'loss' (nats): runs.csv's `test_<metric>`
  and the curves' `evaluation/<metric>`.
  suffixes: label -> the suffix that sweep's config names end with (none: '');
  an arm `c` of sweep `label` is then the config `c + suffixes[label]`.
  running: the directories are sweep (or bank) directories whose runs may be
  unfinished (`read_running_arm`): only `window` is compared, and a last line
  gives the round that every run of each sweep has reached.
  paired_seeds: also list each config's gap to `reference` seed by seed
  (`paired`), one line per sweep and view.
  """
  suffixes = dict(suffixes or {})
  unknown = sorted(set(suffixes) - {label for label, _ in sweeps})
  if unknown:
    raise CompareError('suffixes name labels that no sweep has: ' + ', '.join(unknown))
  if running and not window:
    raise CompareError('a running sweep has no final round to compare: give a window')
  views = ([] if running else [('final', None)]) + (
      [(f'rounds {window[0]}-{window[1]}', window)] if window else [])
  reached = {}  # running: label -> the least last round of its runs

  def read(label: str, directory: str, config: str, w) -> Arm:
    if not running:
      return read_arm(directory, config, w, metric)
    arm, logged = read_running_arm(directory, config, w, metric)
    reached[label] = min(logged, reached.get(label, logged))
    return arm

  arms = {(label, view, c): read(label, d, c + suffixes.get(label, ''), w)
          for label, d in sweeps for view, w in views for c in [reference, *configs]}
  header = ['arm'] + [f'{label}, {view}' for view, _ in views for label, _ in sweeps]
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  for config in [reference, *configs]:
    cells = [arms[(label, view, config)].text() for view, _ in views for label, _ in sweeps]
    seeds = {len(arms[(label, views[0][0], config)].values) for label, _ in sweeps}
    lines.append(f'| {config} ({"/".join(str(n) for n in sorted(seeds))} seeds) | '
                 + ' | '.join(cells) + ' |')
  for config in configs:
    cells = [gap(arms[(label, view, config)], arms[(label, view, reference)]).text()
             for view, _ in views for label, _ in sweeps]
    lines.append(f'| gap {config} - {reference} | ' + ' | '.join(cells) + ' |')
  if paired_seeds:
    lines.append('')
    for view, _ in views:
      for label, _ in sweeps:
        lines.append(f'- paired by seed, {label}, {view}, gap to {reference}: ' + '; '.join(
            _paired_text(arms[(label, view, c)], arms[(label, view, reference)])
            for c in configs))
  base = sweeps[0][0]
  for label, _ in sweeps[1:]:
    lines.append('')
    for view, _ in views:
      parts = []
      for config in [reference, *configs]:
        a, b = arms[(base, view, config)], arms[(label, view, config)]
        parts.append(f'{config} ' + change(a.estimate(), b.estimate()).text())
      for config in configs:
        parts.append(f'gap of {config} ' + change(
            gap(arms[(base, view, config)], arms[(base, view, reference)]),
            gap(arms[(label, view, config)], arms[(label, view, reference)])).text())
      lines.append(f'- {label} against {base}, {view}: ' + '; '.join(parts))
  if running:
    lines.append('')
    lines.append('Running: every run compared has logged round ' + ', '.join(
        f'{reached[label]} ({label})' for label, _ in sweeps) + ' or later.')
  return lines
