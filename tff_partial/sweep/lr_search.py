"""Choosing each config's learning rates from its search runs on the validation split.

The search is a grid (`LrSearch.trials`): `google-vizier` is pinned by TFF,
but its service client needs `equinox` and further JAX packages that the
lock does not hold, and a grid's trials are independent, so they run in
parallel like any other runs of the sweep.
"""

import dataclasses
import json
import math
import os
from typing import Optional

import numpy as np

from tff_partial.sweep import plan
from tff_partial.sweep import spec as spec_lib


def _mean(values) -> float:
  """Mean over seeds; NaN unless every seed finished with a finite value."""
  values = list(values)
  if not values or any(v is None or not math.isfinite(v) for v in values):
    return float('nan')
  return float(np.mean(values))


@dataclasses.dataclass(frozen=True)
class Trial:
  """One grid point: its final validation metric and loss per search seed (None: unfinished)."""

  name: str
  values: dict
  scores: dict
  losses: dict

  @property
  def mean(self) -> float:
    return _mean(self.scores.values())

  @property
  def mean_loss(self) -> float:
    return _mean(self.losses.values())


@dataclasses.dataclass(frozen=True)
class Choice:
  """The chosen grid point of a config (`values`: flag -> value) and every trial.

  earlier: trials of the same search that earlier sweeps ran outside this
  grid (`earlier_trials`), shown in the search tables. The choice is this
  grid's own; earlier trials only judge whether an edge of this grid is
  bracketed (`bracketed_by_earlier`). maximize: whether a larger validation
  metric is better (`spec.LrSearch.maximize`).
  """

  config: str
  values: dict
  trials: list
  earlier: list = dataclasses.field(default_factory=list)
  maximize: bool = True

  @property
  def own_trial(self) -> Trial:
    """The trial of the chosen values."""
    return next(t for t in self.trials if t.values == self.values)

  @property
  def score(self) -> float:
    """The chosen trial's mean validation metric over the search seeds."""
    return self.own_trial.mean

  @property
  def at_edge(self) -> dict:
    """Searched flags whose chosen value is the grid's smallest or largest: flag -> which.

    Such a search has not shown that the best value lies inside its grid: a
    value beyond the edge may be better (docs/sweeps.md, "Widening a search
    whose choice sat at the grid's edge"). Only numeric flags searched over
    two or more values are judged; values without an order are not. An edge
    that earlier sweeps' trials bracket (`bracketed_by_earlier`) is not one.
    """
    bracketed = self.bracketed_by_earlier
    return {flag: which for flag, which in self._grid_edges().items() if flag not in bracketed}

  @property
  def bracketed_by_earlier(self) -> dict:
    """Edges of this grid that earlier sweeps' trials bracket: flag -> their values beyond it.

    An edge is bracketed when earlier trials (`earlier`, from
    `--search_history`) tried values of the flag beyond it and every one of
    them finished worse than the choice (a widened chain whose last spec
    dropped the losing side of the grid, docs/sweeps.md). Worse is judged by
    the ranking `choose` picks by (`rank_key`): the metric, then on equal
    metrics the validation loss, so an earlier trial that ties the metric but
    has the higher loss would have lost inside the grid too. One earlier
    trial beyond the edge that ranks as well or better, or did not finish on
    every seed, leaves the edge open. Written by hand: the grid search is ours.
    """
    out = {}
    edges = self._grid_edges()
    if not edges:
      return out
    to_beat = rank_key(self.own_trial, self.maximize)

    def worse(trial: Trial) -> bool:
      return math.isfinite(trial.mean) and rank_key(trial, self.maximize) < to_beat

    for flag, which in edges.items():
      chosen = self.values[flag]
      beyond = [t for t in self.earlier if _is_number(t.values.get(flag))
                and (t.values[flag] < chosen if which == 'smallest' else t.values[flag] > chosen)]
      if beyond and all(worse(t) for t in beyond):
        out[flag] = values_of(beyond, flag)
    return out

  def _grid_edges(self) -> dict:
    """This grid's own edges (flag -> 'smallest' or 'largest'), earlier trials not counted."""
    edges = {}
    for flag, value in self.values.items():
      grid = self.grid_values(flag)
      if len(grid) < 2 or not all(_is_number(v) for v in grid):
        continue
      if value == grid[0]:
        edges[flag] = 'smallest'
      elif value == grid[-1]:
        edges[flag] = 'largest'
    return edges

  def grid_values(self, flag: str) -> list:
    """The values of `flag` its trials tried, sorted when they are numbers."""
    return values_of(self.trials, flag)

  def values_text(self) -> str:
    """The chosen values as flags, e.g. 'client_learning_rate=0.03, clip_norm=0.1'."""
    return ', '.join(f'{flag}={value_text(value)}' for flag, value in self.values.items())

  def edge_text(self) -> str:
    """One line naming each edge choice ('' if none)."""
    return '; '.join(
        f'{flag} = {value_text(self.values[flag])} is the {which} value of its grid '
        f'({", ".join(value_text(v) for v in self.grid_values(flag))})'
        for flag, which in self.at_edge.items())

  def bracketed_text(self) -> str:
    """One line naming each edge that earlier trials bracket ('' if none)."""
    return '; '.join(
        f'{flag} = {value_text(self.values[flag])} (earlier: '
        f'{", ".join(value_text(v) for v in values)})'
        for flag, values in self.bracketed_by_earlier.items())


def values_of(trials, flag: str) -> list:
  """The values of `flag` that `trials` tried: sorted when they are numbers, else in trial order."""
  values = list(dict.fromkeys(t.values[flag] for t in trials))
  return sorted(values) if all(_is_number(v) for v in values) else values


def value_text(value) -> str:
  """A searched flag's value as the sweep writes it everywhere (lines, tables): 0.003, 1, adam.

  None (a config that did not search this flag) is written as ''.
  """
  if value is None:
    return ''
  return f'{value:g}' if _is_number(value) else str(value)


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_metrics(run_dir: str, metric: str) -> tuple:
  """(`metric`, loss) from the run's final_eval.json; (None, None) if it did not finish."""
  path = os.path.join(run_dir, plan.FINISHED_FILE)
  if not os.path.exists(path):
    return None, None
  with open(path) as f:
    final_eval = json.load(f)
  if not final_eval:
    raise ValueError(f'{path} is empty: the validation split held out no example; raise '
                     '"lr_search".validation_fraction')
  if metric not in final_eval:
    raise ValueError(f'{path} has no metric {metric!r} (it has {", ".join(final_eval)}); '
                     'set "lr_search".metric to one of them')
  return float(final_eval[metric]), float(final_eval.get('loss', math.nan))


def trials(sweep_dir: str, runs, config: str, metric: str) -> list:
  """The search trials of `config`, in grid order."""
  by_trial = {}
  for run in runs:
    if run.is_search and run.config == config:
      trial = by_trial.setdefault(run.trial, Trial(run.trial, dict(run.trial_flags), {}, {}))
      trial.scores[run.seed], trial.losses[run.seed] = read_metrics(
          plan.run_dir(sweep_dir, run), metric)
  return list(by_trial.values())


def _without(flags, keys) -> dict:
  return {k: v for k, v in flags.items() if k not in keys}


def earlier_trials(earlier, runs, config: str, metric: str) -> list:
  """The trials of `config`'s search that earlier sweeps ran outside this sweep's grid.

  earlier: (sweep_dir, runs) of each earlier sweep (`carry.planned_runs`), in
  the order searched; the first that has a grid point gives it. A grid point
  counts when it searched the same flags with the same seeds, and each of its
  runs has every training flag of this sweep's search run of its seed (rounds
  and validation split included) but the searched values: a widened grid's
  chain (docs/sweeps.md) keeps every trial it tried in one table. Points that
  no seed finished are left out.
  """
  own = [r for r in runs if r.is_search and r.config == config]
  if not own:
    return []
  searched = set(own[0].trial_flags)
  reference = {r.seed: _without(plan.train_flags(r), searched) for r in own}
  in_grid = {r.trial for r in own}
  found = {}
  for sweep_dir, earlier_runs in earlier:
    by_trial = {}
    for r in earlier_runs:
      if (r.is_search and r.config == config and set(r.trial_flags) == searched
          and r.trial not in in_grid and r.trial not in found):
        by_trial.setdefault(r.trial, []).append(r)
    for trial, trial_runs in by_trial.items():
      if ({r.seed for r in trial_runs} != set(reference)
          or any(_without(plan.train_flags(r), searched) != reference[r.seed]
                 for r in trial_runs)):
        continue
      t = Trial(trial, dict(trial_runs[0].trial_flags), {}, {})
      for r in trial_runs:
        t.scores[r.seed], t.losses[r.seed] = read_metrics(plan.run_dir(sweep_dir, r), metric)
      if any(v is not None for v in t.scores.values()):
        found[trial] = t
  return list(found.values())


def rank_key(trial: Trial, maximize: bool) -> tuple:
  """The order `choose` ranks trials by (larger is better): the metric, then the lower loss."""
  loss = trial.mean_loss if math.isfinite(trial.mean_loss) else math.inf
  return ((1.0 if maximize else -1.0) * trial.mean, -loss)


def choose(sweep_dir: str, runs, config: str, search: spec_lib.LrSearch) -> Choice:
  """The trial with the best mean validation metric; ValueError if none finished.

  Equal metrics (frequent for accuracy on a small validation split) go to the
  lower mean validation loss, then to the first in grid order.
  """
  found = trials(sweep_dir, runs, config, search.metric)
  scored = [t for t in found if math.isfinite(t.mean)]
  if not scored:
    raise ValueError(f'no learning-rate search run of {config} finished with a finite '
                     f'validation {search.metric}')
  best = max(scored, key=lambda t: rank_key(t, search.maximize))  # max keeps the first of equals
  return Choice(config=config, values=dict(best.values), trials=found,
                maximize=search.maximize)
