"""Per-participant results: CSV, and the paper's summary numbers.

Yu et al. 2020 report, per federated model (basic, DP, robust): mean and
median accuracy over participants, how many participants' local models beat
the federated model (sections 5), and how many still beat the adapted model
(section 7, "adapted underperforms the local model"), and which adaptation
technique is best per participant (figure colours).

Conventions: "A < B" is strict (ties count as not below). `best_adapted` is,
per participant, the highest accuracy over the adaptation strategies that
were run (as the paper's figures colour each participant by its best
technique; note that choosing it on the test data is optimistic). The best
strategy of a participant is the first one, in column order, with that
highest accuracy; `ties` counts participants where several share it.
"""

import collections
import csv
import statistics
from typing import Iterable, Mapping, Sequence

from tff_partial.training import atomic

FEDERATED = 'federated'
LOCAL = 'local'
BEST = 'best_adapted'
_ID_COLUMNS = ('participant', 'split', 'num_train', 'num_test')


def write_csv(path: str, rows: Sequence[Mapping], columns: Sequence[str]) -> None:
  """Writes the rows atomically: a kill leaves the previous file whole."""
  with atomic.atomic_write(path, newline='') as f:
    writer = csv.DictWriter(f, fieldnames=list(columns))
    writer.writeheader()
    for row in rows:
      writer.writerow({c: row[c] for c in columns})


def read_csv(path: str) -> tuple[list, list]:
  """(rows, strategy names): accuracies as floats, in file order."""
  with open(path, newline='') as f:
    reader = csv.DictReader(f)
    columns = list(reader.fieldnames or [])
    missing = [c for c in ('participant', FEDERATED, LOCAL) if c not in columns]
    if missing:
      raise ValueError(f'{path}: missing column(s) {missing}; columns: {columns}')
    strategy_names = [c for c in columns if c not in _ID_COLUMNS + (FEDERATED, LOCAL)]
    rows = []
    for raw in reader:
      row = collections.OrderedDict(raw)
      for c in (FEDERATED, LOCAL, *strategy_names):
        row[c] = float(raw[c])
      for c in ('num_train', 'num_test'):
        if c in row:
          row[c] = int(row[c])
      rows.append(row)
  return rows, strategy_names


def best_strategy(row: Mapping, strategy_names: Sequence[str]) -> tuple[str, float, bool]:
  """(first strategy with the highest accuracy, that accuracy, tied?)."""
  best = max(row[s] for s in strategy_names)
  winners = [s for s in strategy_names if row[s] == best]
  return winners[0], best, len(winners) > 1


def _count(flags: Iterable[bool], n: int) -> dict:
  count = sum(1 for f in flags if f)
  return {'count': count, 'share': count / n if n else float('nan')}


def cmp(a: float, b: float) -> int:
  """1 if a > b, 0 if equal, -1 if a < b."""
  return (a > b) - (a < b)


def summarize(rows: Sequence[Mapping], strategy_names: Sequence[str]) -> dict:
  """The summary dict (JSON-serialisable) of per-participant rows."""
  if not rows:
    raise ValueError('no participants to summarize')
  if not strategy_names:
    raise ValueError('summarize needs at least one adaptation strategy column')
  n = len(rows)
  best = [best_strategy(r, strategy_names) for r in rows]
  values = {m: [r[m] for r in rows] for m in (FEDERATED, LOCAL, *strategy_names)}
  values[BEST] = [b[1] for b in best]
  adapted = (*strategy_names, BEST)
  return {
      'num_participants': n,
      'strategies': list(strategy_names),
      'accuracy': {
          m: {'mean': statistics.fmean(v), 'median': statistics.median(v)}
          for m, v in values.items()
      },
      'federated_below_local': _count(
          (r[FEDERATED] < r[LOCAL] for r in rows), n),
      'adapted_below_local': {
          m: _count((a < r[LOCAL] for a, r in zip(values[m], rows)), n)
          for m in adapted
      },
      'adapted_below_federated': {
          m: _count((a < r[FEDERATED] for a, r in zip(values[m], rows)), n)
          for m in adapted
      },
      # Adaptation helped / left unchanged / hurt each participant, judged
      # against its federated model (the paper's figures 3-6 question).
      'adapted_vs_federated': {
          m: {k: _count((cmp(a, r[FEDERATED]) == v for a, r in zip(values[m], rows)), n)
              for k, v in (('helped', 1), ('unchanged', 0), ('hurt', -1))}
          for m in adapted
      },
      'best_adapted_above_both': _count(
          (b[1] > r[LOCAL] and b[1] > r[FEDERATED] for b, r in zip(best, rows)), n),
      'best_strategy_counts': {
          s: sum(1 for b in best if b[0] == s) for s in strategy_names
      },
      'best_strategy_ties': sum(1 for b in best if b[2]),
  }


def format_table(summary: Mapping) -> str:
  """A plain-text table of the summary, for the terminal and logs."""
  n = summary['num_participants']
  lines = [f'{n} participants',
           f'{"method":<14}{"mean":>8}{"median":>8}{"< local":>12}{"< federated":>14}{"best for":>10}']
  for m, acc in summary['accuracy'].items():
    below_local = below_fed = best_for = ''
    if m == FEDERATED:
      c = summary['federated_below_local']
      below_local = f'{c["count"]} ({c["share"]:.0%})'
    elif m != LOCAL:
      c = summary['adapted_below_local'][m]
      below_local = f'{c["count"]} ({c["share"]:.0%})'
      c = summary['adapted_below_federated'][m]
      below_fed = f'{c["count"]} ({c["share"]:.0%})'
      if m in summary['best_strategy_counts']:
        best_for = str(summary['best_strategy_counts'][m])
    lines.append(f'{m:<14}{acc["mean"]:>8.4f}{acc["median"]:>8.4f}'
                 f'{below_local:>12}{below_fed:>14}{best_for:>10}')
  c = summary['adapted_vs_federated']['best_adapted']
  lines.append('best adapted vs federated: helped {} ({:.0%}), unchanged {} ({:.0%}), '
               'hurt {} ({:.0%})'.format(
                   c['helped']['count'], c['helped']['share'],
                   c['unchanged']['count'], c['unchanged']['share'],
                   c['hurt']['count'], c['hurt']['share']))
  c = summary['best_adapted_above_both']
  lines.append(f'best adapted beats both federated and local for {c["count"]} '
               f'({c["share"]:.0%}); ties for best strategy: {summary["best_strategy_ties"]}')
  return '\n'.join(lines)
