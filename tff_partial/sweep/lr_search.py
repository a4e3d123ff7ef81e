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


@dataclasses.dataclass(frozen=True)
class Trial:
  """One grid point: its final validation metric per search seed (None: not finished)."""

  name: str
  values: dict
  scores: dict

  @property
  def mean(self) -> float:
    """Mean over seeds; NaN unless every seed finished with a finite metric."""
    scores = list(self.scores.values())
    if not scores or any(s is None or not math.isfinite(s) for s in scores):
      return float('nan')
    return float(np.mean(scores))


@dataclasses.dataclass(frozen=True)
class Choice:
  """The chosen grid point of a config (`values`: flag -> value) and every trial."""

  config: str
  values: dict
  score: float
  trials: list


def read_metric(run_dir: str, metric: str) -> Optional[float]:
  """`metric` from the run's final_eval.json; None if the run did not finish."""
  path = os.path.join(run_dir, plan.FINISHED_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    final_eval = json.load(f)
  if metric not in final_eval:
    raise ValueError(f'{path} has no metric {metric!r} (it has {", ".join(final_eval)}); '
                     'set "lr_search".metric to one of them')
  return float(final_eval[metric])


def trials(sweep_dir: str, runs, config: str, metric: str) -> list:
  """The search trials of `config`, in grid order."""
  by_trial = {}
  for run in runs:
    if run.is_search and run.config == config:
      trial = by_trial.setdefault(run.trial, Trial(run.trial, dict(run.trial_flags), {}))
      trial.scores[run.seed] = read_metric(plan.run_dir(sweep_dir, run), metric)
  return list(by_trial.values())


def choose(sweep_dir: str, runs, config: str, search: spec_lib.LrSearch) -> Choice:
  """The trial with the best mean validation metric (first of equals); ValueError if none."""
  found = trials(sweep_dir, runs, config, search.metric)
  scored = [t for t in found if math.isfinite(t.mean)]
  if not scored:
    raise ValueError(f'no learning-rate search run of {config} finished with a finite '
                     f'validation {search.metric}')
  sign = 1.0 if search.maximize else -1.0
  best = max(scored, key=lambda t: sign * t.mean)  # max keeps the first of equals
  return Choice(config=config, values=dict(best.values), score=best.mean, trials=found)
