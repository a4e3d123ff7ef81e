"""Seconds per round against clients per round, with a least-squares line."""

import collections
import contextlib
from typing import Any, Callable, Optional, Sequence

from absl import logging
import numpy as np

from tff_partial.bench import cohorts as cohorts_lib
from tff_partial.bench import rounds as rounds_lib


def linear_fit(xs, ys) -> dict:
  """slope, intercept and R^2 of the least-squares line through (xs, ys)."""
  xs, ys = np.asarray(xs, float), np.asarray(ys, float)
  slope, intercept = np.polyfit(xs, ys, 1)
  pred = slope * xs + intercept
  ss_tot = float(np.sum((ys - ys.mean()) ** 2))
  r2 = 1.0 - float(np.sum((ys - pred) ** 2)) / ss_tot if ss_tot > 0 else 1.0
  return {'slope': float(slope), 'intercept': float(intercept), 'r2': r2}


def sweep(
    candidates_fn: Callable[[int], tuple[list, dict]],
    task,
    cohort_sizes: Sequence[int],
    *,
    seed: int,
    rounds: int,
    warmup: int,
    usage_fn: Optional[Callable[[], Any]] = None,
    after_size: Optional[Callable[[dict, dict], None]] = None,
) -> 'collections.OrderedDict[str, dict]':
  """Median seconds per round of each configuration at each cohort size.

  Args:
    candidates_fn: cohort size -> (candidates built for it, {name: reason}
      of configurations that were skipped); called once per size.
    task: the registry task.
    cohort_sizes: clients per round to sweep; a cohort larger than the
      population samples with replacement.
    seed, rounds, warmup: as `rounds.run_interleaved`.
    usage_fn: a context manager factory measuring one size's resources
      (`tff_partial.runtime.ResourceUsage`: peak RSS and CPU seconds of the
      coordinator and each worker); its `result()` goes to `after_size`.
    after_size: called after each size with (the result so far, the usage
      dict or {}), e.g. to write a partial report.

  Returns:
    name -> {'median_round_seconds': [one per size], 'median_round_cpu_seconds':
    [...], slope, intercept, r2 (of wall seconds), 'cpu_fit': {slope,
    intercept, r2} (of CPU seconds)} or {'skipped': reason}.
  """
  client_ids = list(task.train_data.client_ids)
  result = collections.OrderedDict()
  for size in cohort_sizes:
    candidates, skipped = candidates_fn(size)
    for name, reason in skipped.items():
      result[name] = {'skipped': reason}
    round_cohorts = cohorts_lib.sample_cohorts(client_ids, seed, rounds, size)
    with (usage_fn() if usage_fn else contextlib.nullcontext()) as usage:
      rows, _ = rounds_lib.run_interleaved(candidates, task, round_cohorts, seed=seed,
                                        warmup=warmup)
    for row in rows:
      entry = result.setdefault(
          row['name'], {'median_round_seconds': [], 'median_round_cpu_seconds': []})
      entry['median_round_seconds'].append(row['median_round_seconds'])
      entry['median_round_cpu_seconds'].append(row['median_round_cpu_seconds'])
      logging.info('%s: %d clients/round: %.2fs (%.2f CPU s)', row['name'], size,
                   row['median_round_seconds'], row['median_round_cpu_seconds'])
    if after_size is not None:
      after_size(result, usage.result() if usage is not None else {})
  for entry in result.values():
    if 'skipped' not in entry and len(cohort_sizes) > 1:
      entry.update(linear_fit(cohort_sizes, entry['median_round_seconds']))
      entry['cpu_fit'] = linear_fit(cohort_sizes, entry['median_round_cpu_seconds'])
  return result
