"""Per-config summaries over seeds: final test metrics with 95% intervals, curves, bytes.

Read from each run's own outputs: `final_eval.json` (the final test metrics),
`metrics.csv` (per round: `evaluation/<metric>`, `evaluation/loss`,
`comm/bytes_down_per_client`, `comm/bytes_up_per_client`) and `flags.json`
(the CPU path it started on, `cpu_path_resolved`).

Warnings in summary.md: configs whose searched values are the smallest or
largest of their grid (`lr_search.Choice.at_edge`), and runs that come from
more than one CPU path.

Each table reports the spec's summary metric (`"summary": {"metric": ...}`,
accuracy by default) and a second one beside it (`second_metric`): the loss,
or, when the summary metric is the loss, the accuracy.

Definitions (also written into summary.md):
* mean and standard deviation over seeds (sample standard deviation, n - 1);
  95% confidence interval of the mean from Student's t with n - 1 degrees of
  freedom (`scipy.stats.t.interval`); none with one seed.
* best round: the evaluation round at which the mean over seeds of the test
  metric is highest (lowest for `loss`).
* plateau round: the mean curve is smoothed by a trailing moving average over
  `plateau_window` evaluations; the plateau round is the first evaluation
  round from which the smoothed curve stays within `plateau_tolerance` of its
  final value. A config "plateaued" when that round is at most 80% of its last
  round, i.e. the curve moved less than the tolerance over the last 20% or more
  of training; otherwise it was still moving when it stopped.
* bytes per client: the sum over training rounds of the exact bytes one
  participating client receives and sends in that round (the per-round
  constants of metrics.csv), i.e. the communication of a client that takes
  part in every round.
"""

import csv
import dataclasses
import json
import math
import os
from typing import Any, Mapping, Optional, Sequence

import numpy as np
from scipy import stats

from tff_partial.sweep import lr_search
from tff_partial.sweep import plan
from tff_partial.training import atomic
from tff_partial.training import resumable

PLATEAUED_FRACTION = 0.8


def second_metric(metric: str) -> str:
  """The final test metric reported beside `metric`: the loss, or for the loss the accuracy."""
  return 'accuracy' if metric == 'loss' else 'loss'


@dataclasses.dataclass(frozen=True)
class Stats:
  n: int
  mean: float
  std: float
  ci_low: float
  ci_high: float


def describe(values: Sequence[float]) -> Stats:
  """Mean, sample std and the t-based 95% confidence interval of the mean."""
  values = np.asarray(values, dtype=np.float64)
  n = len(values)
  if n == 0:
    return Stats(0, math.nan, math.nan, math.nan, math.nan)
  mean = float(np.mean(values))
  if n == 1:
    return Stats(1, mean, math.nan, math.nan, math.nan)
  std = float(np.std(values, ddof=1))
  if std == 0.0:
    return Stats(n, mean, 0.0, mean, mean)
  low, high = stats.t.interval(0.95, n - 1, loc=mean, scale=std / math.sqrt(n))
  return Stats(n, mean, std, float(low), float(high))


def smooth(values: Sequence[float], window: int) -> np.ndarray:
  """Trailing moving average over `window` points (fewer at the start)."""
  values = np.asarray(values, dtype=np.float64)
  sums = np.cumsum(np.concatenate([[0.0], values]))
  index = np.arange(1, len(values) + 1)
  start = np.maximum(index - window, 0)
  return (sums[index] - sums[start]) / (index - start)


def plateau_round(rounds: Sequence[int], values: Sequence[float], *, tolerance: float,
                  window: int) -> Optional[int]:
  """First round from which the smoothed curve stays within `tolerance` of its end."""
  if len(values) == 0:
    return None
  smoothed = smooth(values, window)
  outside = np.nonzero(np.abs(smoothed - smoothed[-1]) > tolerance)[0]
  first = 0 if len(outside) == 0 else int(outside[-1]) + 1
  return int(rounds[first])


def read_metrics_csv(path: str) -> list:
  """Rows of metrics.csv by round (a round written twice, by a resumed run: the last)."""
  with open(path, newline='') as f:
    rows = {int(r['round_num']): r for r in csv.DictReader(f)}
  return [rows[k] for k in sorted(rows)]


def _float(text) -> float:
  return float(text) if text not in (None, '') else math.nan


@dataclasses.dataclass(frozen=True)
class RunResult:
  """One finished run: its final test metrics and its evaluation curve."""

  run_id: str
  config: str
  seed: int
  final: Mapping[str, float]
  rounds: np.ndarray  # evaluation rounds, from 0 (the initial model)
  metric: np.ndarray  # evaluation/<metric> at `rounds`
  second: np.ndarray  # evaluation/<second_metric(metric)> at `rounds` (nan: not logged)
  cumulative_bytes: np.ndarray  # bytes per client (down + up) up to each of `rounds`
  bytes_down: int
  bytes_up: int
  cpu_path: str = ''  # flags.json's record of where it started ('' in runs before it)
  steps_per_client: float = math.nan  # mean local steps a client (`local_steps_per_client`)


def _run_flags(directory: str) -> dict:
  try:
    return resumable.read_flags(directory) or {}
  except (OSError, ValueError):
    return {}


def _nanmean(values: Sequence[float]) -> float:
  """The mean of the values that are not nan (nan if none is)."""
  kept = [v for v in values if not math.isnan(v)]
  return float(np.mean(kept)) if kept else math.nan


def local_steps_per_client(rows: Sequence[Mapping[str, str]], clients_per_round) -> float:
  """Mean local steps a client over a run's training rounds (nan if not logged).

  The steps a client takes come from --client_epochs, --client_max_batches and
  the client's own data together, so a cap that binds for few clients shows
  here: the batches trained over a round's clients (`.../train/num_batches`)
  divided by `clients_per_round`, averaged over the rounds.
  """
  key = next((k for k in (rows[0] if rows else {}) if k.endswith('train/num_batches')), None)
  if key is None or not clients_per_round:
    return math.nan
  return _nanmean([_float(r.get(key)) for r in rows
                   if int(r['round_num']) >= 1]) / float(clients_per_round)


def read_run(sweep_dir: str, run: plan.Run, metric: str) -> Optional[RunResult]:
  """The results of a finished run (None if it has not finished)."""
  directory = plan.run_dir(sweep_dir, run)
  if not plan.is_finished(sweep_dir, run):
    return None
  with open(os.path.join(directory, plan.FINISHED_FILE)) as f:
    final = {k: float(v) for k, v in json.load(f).items()}
  rows = read_metrics_csv(os.path.join(directory, resumable.METRICS_FILE))
  per_round = {int(r['round_num']): (int(float(r['comm/bytes_down_per_client'])),
                                     int(float(r['comm/bytes_up_per_client'])))
               for r in rows if int(r['round_num']) >= 1}
  cumulative = {0: 0}
  for k in range(1, max(per_round, default=0) + 1):
    down, up = per_round.get(k, (0, 0))
    cumulative[k] = cumulative[k - 1] + down + up
  evaluated = [r for r in rows if r.get(f'evaluation/{metric}') not in (None, '')]
  rounds = np.array([int(r['round_num']) for r in evaluated], dtype=np.int64)
  run_flags = _run_flags(directory)
  return RunResult(
      run_id=run.run_id, config=run.config, seed=run.seed, final=final, rounds=rounds,
      metric=np.array([_float(r[f'evaluation/{metric}']) for r in evaluated]),
      second=np.array([_float(r.get(f'evaluation/{second_metric(metric)}'))
                       for r in evaluated]),
      cumulative_bytes=np.array([cumulative.get(int(k), 0) for k in rounds], dtype=np.int64),
      bytes_down=sum(d for d, _ in per_round.values()),
      bytes_up=sum(u for _, u in per_round.values()),
      cpu_path=str(run_flags.get(resumable.CPU_PATH_KEY, '')),
      steps_per_client=local_steps_per_client(rows, run_flags.get('clients_per_round')))


@dataclasses.dataclass(frozen=True)
class ConfigSummary:
  """A config over its finished seeds (`metric` and `second`: final test values).

  `second` is the final test `second_metric(metric)` (nan where a run's
  final_eval.json lacks it).
  """

  config: str
  own_flags: Mapping[str, Any]
  tuned: Mapping[str, Any]
  seeds: tuple
  missing_seeds: tuple
  metric: Stats
  second: Stats
  rounds: np.ndarray  # evaluation rounds common to all seeds
  curve_mean: np.ndarray
  curve_std: np.ndarray
  second_curve_mean: np.ndarray  # the same for `second_metric(metric)`
  second_curve_std: np.ndarray
  cumulative_bytes: np.ndarray
  best_round: Optional[int]
  best_value: float
  plateau_round: Optional[int]
  plateaued: Optional[bool]
  last_round: Optional[int]
  bytes_down: float
  bytes_up: float
  choice: Optional[lr_search.Choice] = None  # the search that chose `tuned`
  steps_per_client: float = math.nan  # mean over the seeds that logged it

  @property
  def tuned_at_edge(self) -> dict:
    return self.choice.at_edge if self.choice else {}


def _over_seeds(curves: np.ndarray) -> tuple:
  """Mean and sample std over the rows (runs) of `curves` (std 0 for one run)."""
  mean = curves.mean(axis=0)
  return mean, (curves.std(axis=0, ddof=1) if len(curves) > 1 else np.zeros_like(mean))


def summarize_config(config, runs: Sequence[plan.Run], results: Sequence[RunResult], *,
                     metric: str, tolerance: float, window: int,
                     choice: Optional[lr_search.Choice] = None) -> ConfigSummary:
  """The summary of one config from its runs' results (finished runs only).

  `choice`: the search that chose the config's tuned values, if any (its own
  or its `lr_from` config's).
  """
  seeds = tuple(r.seed for r in results)
  missing = tuple(r.seed for r in runs if r.seed not in seeds)
  maximize = metric != 'loss'
  if results:
    rounds = sorted(set.intersection(*(set(r.rounds.tolist()) for r in results)))
    # Where each run logged those rounds (its rounds are ascending: read_metrics_csv's order).
    at = [np.searchsorted(r.rounds, rounds) for r in results]
    mean, std = _over_seeds(np.array([r.metric[i] for r, i in zip(results, at)]))
    second_mean, second_std = _over_seeds(np.array([r.second[i] for r, i in zip(results, at)]))
    cumulative = results[0].cumulative_bytes[at[0]]
    trained = [i for i, k in enumerate(rounds) if k >= 1]
  else:
    rounds, cumulative, trained = [], np.array([]), []
    mean = std = second_mean = second_std = np.array([])
  best_round, best_value, plateau, plateaued, last = None, math.nan, None, None, None
  if trained:
    values = mean[trained]
    kept = [rounds[i] for i in trained]
    best = int(np.argmax(values) if maximize else np.argmin(values))
    best_round, best_value = int(kept[best]), float(values[best])
    plateau = plateau_round(kept, values, tolerance=tolerance, window=window)
    last = int(kept[-1])
    plateaued = plateau <= PLATEAUED_FRACTION * last
  return ConfigSummary(
      config=config.name, own_flags=dict(config.own_flags),
      tuned=dict(choice.values) if choice else {},
      seeds=seeds, missing_seeds=missing,
      metric=describe([r.final[metric] for r in results]),
      second=describe([r.final.get(second_metric(metric), math.nan) for r in results]),
      rounds=np.asarray(rounds, dtype=np.int64), curve_mean=mean, curve_std=std,
      second_curve_mean=second_mean, second_curve_std=second_std,
      cumulative_bytes=np.asarray(cumulative, dtype=np.int64),
      best_round=best_round, best_value=best_value, plateau_round=plateau,
      plateaued=plateaued, last_round=last,
      bytes_down=float(np.mean([r.bytes_down for r in results])) if results else math.nan,
      bytes_up=float(np.mean([r.bytes_up for r in results])) if results else math.nan,
      choice=choice,
      steps_per_client=_nanmean([r.steps_per_client for r in results]))


def _cell(value) -> str:
  if value is None:
    return ''
  if isinstance(value, bool):
    return 'yes' if value else 'no'
  if isinstance(value, float):
    return '' if math.isnan(value) else f'{value:.4g}'
  if isinstance(value, (list, tuple)):
    return ','.join(map(str, value))
  return str(value)


def _tuned_names(summaries) -> list:
  names = []
  for s in summaries:
    names += [k for k in s.tuned if k not in names]
  return names


def summary_rows(summaries: Sequence[ConfigSummary], metric: str) -> list:
  """One dict per config: the columns of summary.csv."""
  rows = []
  tuned = _tuned_names(summaries)
  for s in summaries:
    row = {'config': s.config, 'seeds': len(s.seeds),
           'missing_seeds': ','.join(map(str, s.missing_seeds))}
    for name in tuned:
      row[name] = s.tuned.get(name, '')
    for key, st in ((metric, s.metric), (second_metric(metric), s.second)):
      row.update({f'test_{key}_mean': st.mean, f'test_{key}_std': st.std,
                  f'test_{key}_ci95_low': st.ci_low, f'test_{key}_ci95_high': st.ci_high})
    row.update({'best_round': s.best_round, f'best_mean_{metric}': s.best_value,
                'plateau_round': s.plateau_round, 'plateaued': s.plateaued,
                'last_round': s.last_round,
                'bytes_down_per_client': s.bytes_down, 'bytes_up_per_client': s.bytes_up,
                'bytes_total_per_client': s.bytes_down + s.bytes_up,
                'local_steps_per_client': s.steps_per_client})
    if tuned:
      row['tuned_at_grid_edge'] = ';'.join(f'{k}={v}' for k, v in s.tuned_at_edge.items())
    rows.append(row)
  return rows


def _write_csv(path: str, rows: Sequence[Mapping[str, Any]]) -> None:
  fields = []
  for row in rows:
    fields += [k for k in row if k not in fields]
  with atomic.atomic_write(path, newline='') as f:
    writer = csv.DictWriter(f, fieldnames=fields)
    writer.writeheader()
    for row in rows:
      writer.writerow({k: ('' if v is None else v) for k, v in row.items()})


def _mean_std(st: Stats, metric: str) -> str:
  scale, digits = metric_scale(metric)[0], metric_digits(metric)
  if st.n == 0 or math.isnan(st.mean):
    return ''
  if st.n == 1:
    return f'{scale * st.mean:.{digits}f}'
  return f'{scale * st.mean:.{digits}f} ± {scale * st.std:.{digits}f}'


def _interval(st: Stats, metric: str) -> str:
  scale, digits = metric_scale(metric)[0], metric_digits(metric)
  if st.n < 2 or math.isnan(st.mean):
    return ''
  return f'[{scale * st.ci_low:.{digits}f}, {scale * st.ci_high:.{digits}f}]'


def _cpu_path_note(results: Sequence[RunResult]) -> list:
  """Lines naming the CPU paths of `results` when they are more than one ([] if not)."""
  by_path = {}
  for r in results:
    by_path.setdefault(r.cpu_path or 'not recorded (a run from before the record)',
                       []).append(r)
  if len(by_path) < 2:
    return []
  lines = ['', '**Runs from more than one CPU path.** The oneDNN paths round differently, so the '
           'same flags and seed give other numbers on each (runs.csv, column `cpu_path`):']
  for path, runs in by_path.items():
    configs = sorted({r.config for r in runs})
    lines.append(f'- {path}: {len(runs)} run(s) of ' + ', '.join(f'`{c}`' for c in configs))
  return lines


def metric_scale(metric: str) -> tuple:
  """(factor, unit) a metric is shown in: the loss as it is, other metrics in %."""
  return (1.0, '') if metric == 'loss' else (100.0, ' (%)')


def metric_digits(metric: str) -> int:
  """Decimals a metric is shown with: the loss three (nats), a percentage two."""
  return 3 if metric == 'loss' else 2


def search_table(choice, metric: str) -> list:
  """Markdown lines: the mean validation `metric` of every trial of `choice`'s search.

  Two searched flags: a grid (rows: the first flag's values, columns: the
  second's), the way one reads where a choice sits in it; otherwise one row per
  trial. The chosen trial is bold; trials of earlier sweeps outside this grid
  (`choice.earlier`) are in italics; an unfinished or untried point is blank.
  In % (two decimals) unless the metric is the loss (three).
  """
  scale, digits = metric_scale(metric)[0], metric_digits(metric)
  trials = list(choice.trials) + list(choice.earlier)
  earlier = {t.name for t in choice.earlier}
  searched = [f for f in choice.values if len(lr_search.values_of(trials, f)) > 1]

  def cell(trial) -> str:
    if trial is None or math.isnan(trial.mean):
      return ''
    text = f'{scale * trial.mean:.{digits}f}'
    if trial.values == choice.values:
      return f'**{text}**'
    return f'*{text}*' if trial.name in earlier else text

  if len(searched) == 2:
    rows, columns = searched
    column_values = lr_search.values_of(trials, columns)
    by_values = {(t.values[rows], t.values[columns]): t for t in trials}
    lines = [f'| {rows} \\ {columns} | '
             + ' | '.join(lr_search.value_text(v) for v in column_values) + ' |',
             '|---|' + '---|' * len(column_values)]
    for r in lr_search.values_of(trials, rows):
      lines.append(f'| {lr_search.value_text(r)} | ' + ' | '.join(
          cell(by_values.get((r, c))) for c in column_values) + ' |')
    return lines
  if earlier:  # in the order of the searched values, the earlier trials among them
    order = {f: lr_search.values_of(trials, f) for f in searched}
    trials.sort(key=lambda t: [order[f].index(t.values[f]) for f in searched])
  lines = ['| ' + ' | '.join(searched + [f'validation {metric}']) + ' |',
           '|' + '---|' * (len(searched) + 1)]
  for t in trials:
    lines.append('| ' + ' | '.join([lr_search.value_text(t.values[f]) for f in searched]
                                   + [cell(t)]) + ' |')
  return lines


def write(out_dir: str, *, name: str, description: str, summaries: Sequence[ConfigSummary],
          results: Sequence[RunResult], choices: Mapping[str, Any], metric: str,
          tolerance: float, window: int, search_metric: str = 'accuracy') -> dict:
  """summary.md, summary.csv, runs.csv and lr_search.csv in `out_dir`; their paths."""
  os.makedirs(out_dir, exist_ok=True)
  paths = {key: os.path.join(out_dir, file_name) for key, file_name in (
      ('summary', 'summary.md'), ('summary_csv', 'summary.csv'), ('runs', 'runs.csv'),
      ('lr_search', 'lr_search.csv'))}
  _write_csv(paths['summary_csv'], summary_rows(summaries, metric))
  second = second_metric(metric)
  run_rows = []
  for r in results:
    trained = r.rounds >= 1
    plateau = plateau_round(r.rounds[trained], r.metric[trained], tolerance=tolerance,
                            window=window) if trained.any() else None
    run_rows.append({'run': r.run_id, 'config': r.config, 'seed': r.seed,
                     f'test_{metric}': r.final[metric],
                     f'test_{second}': r.final.get(second, math.nan),
                     'plateau_round': plateau, 'bytes_down_per_client': r.bytes_down,
                     'bytes_up_per_client': r.bytes_up,
                     'local_steps_per_client': r.steps_per_client, 'cpu_path': r.cpu_path})
  _write_csv(paths['runs'], run_rows)
  search_rows = []
  for config, choice in choices.items():
    for in_grid, trials in ((True, choice.trials), (False, choice.earlier)):
      for trial in trials:
        row = {'config': config, 'trial': trial.name, **trial.values}
        row.update({f'seed_{s}': v for s, v in trial.scores.items()})
        row.update({f'mean_validation_{search_metric}': trial.mean,
                    'mean_validation_loss': trial.mean_loss,
                    'chosen': trial.values == choice.values, 'in_grid': in_grid})
        search_rows.append(row)
  if search_rows:
    _write_csv(paths['lr_search'], search_rows)
  else:
    paths.pop('lr_search')

  unit = metric_scale(metric)[1]
  second_unit = metric_scale(second)[1]
  tuned = _tuned_names(summaries)
  lines = [f'# Sweep `{name}`', '']
  if description:
    lines += [description, '']
  header = (['config', 'seeds'] + [f'tuned {t}' for t in tuned] +
            [f'test {metric}{unit} mean ± std', '95% CI', f'test {second}{second_unit} mean ± std',
             '95% CI',
             'best round', 'plateau round', 'plateaued', 'MB per client (down + up)',
             'local steps a client'])
  lines += ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  for s in summaries:
    seeds = f'{len(s.seeds)}' + (f' ({len(s.missing_seeds)} missing)' if s.missing_seeds else '')
    cells = ([s.config, seeds] + [lr_search.value_text(s.tuned.get(t)) for t in tuned] +
             [_mean_std(s.metric, metric), _interval(s.metric, metric),
              _mean_std(s.second, second), _interval(s.second, second),
              _cell(s.best_round), _cell(s.plateau_round),
              _cell(s.plateaued),
              '' if math.isnan(s.bytes_down) else f'{(s.bytes_down + s.bytes_up) / 1e6:.1f}',
              '' if math.isnan(s.steps_per_client) else f'{s.steps_per_client:.2f}'])
    lines.append('| ' + ' | '.join(cells) + ' |')
  at_edge = [s for s in summaries if s.tuned_at_edge]
  if at_edge:
    lines += ['', '**Warning: a searched value at its grid\'s edge.** A value beyond the edge '
              'may be better, so these configs may be under-tuned; widen the grid and rerun with '
              '`--resume_from` (docs/sweeps.md, "Widening a search whose choice sat at the '
              'grid\'s edge"):']
    for s in at_edge:
      by = s.choice.config
      source = '' if by == s.config else f' (values from `{by}`\'s search)'
      lines.append(f'- `{s.config}`{source}: {s.choice.edge_text()}.')
  lines += _cpu_path_note(results)
  search_unit = metric_scale(search_metric)[1]
  for config, choice in choices.items():
    lines += ['', f'Search of `{config}`: mean validation {search_metric}{search_unit} per grid '
              'point, the chosen one in bold:', '']
    lines += search_table(choice, search_metric)
    if choice.earlier:
      lines += ['', f'In italics: {len(choice.earlier)} trial(s) of earlier sweeps '
                '(`--search_history`) outside this grid; shown, not chosen from.']
      if choice.bracketed_by_earlier:
        lines += [f'At this grid\'s edge but bracketed by earlier trials beyond it, each worse '
                  f'than the choice: {choice.bracketed_text()}.']
  lines += ['', '| config | flags beyond the base |', '|---|---|']
  for s in summaries:
    flags = ' '.join(f'--{k}={_cell(v)}' for k, v in s.own_flags.items())
    lines.append(f'| {s.config} | {flags} |')
  lines += [
      '',
      f'Final test {metric} and {second}: each run\'s `final_eval.json` (the test clients), over '
      'seeds: mean ± sample standard deviation; 95% CI of the mean from Student\'s t with '
      'n - 1 degrees of freedom.',
      f'Best round: where the mean-over-seeds test {metric} curve peaks. Plateau round: the '
      f'first evaluation round from which that curve, smoothed by a trailing mean over '
      f'{window} evaluations, stays within {tolerance:g} of its final smoothed value; '
      f'"plateaued": the plateau round is at most {PLATEAUED_FRACTION:.0%} of the last round.',
      'MB per client: the exact bytes a participating client receives plus sends, summed over '
      'all rounds (metrics.csv).',
      'Local steps a client: the batches trained over a round\'s clients '
      '(`client_work/train/num_batches`) divided by --clients_per_round, averaged over the '
      'rounds and seeds; --client_epochs, --client_max_batches and the clients\' data sizes '
      'set it together (blank: not logged).',
  ]
  if search_rows:
    lines.append(f'Tuned values: the best mean final validation {search_metric} of the '
                 'learning-rate search (held-out training examples; lr_search.csv).')
  with atomic.atomic_write(paths['summary']) as f:
    f.write('\n'.join(lines) + '\n')
  return paths
