"""Round timing: configurations run side by side, interleaved round by round.

A `Candidate` is one configuration ready to run: its built method and the
function that makes its client values. `run_interleaved` runs round r of
every candidate (in an order rotated each round, so that load changes on a
shared machine hit all of them alike), then round r+1, on the same cohorts,
and returns what each measured.

Per round it records wall seconds (building the cohort's client values +
`process.next`), CPU seconds of this process and its TFF worker
(`machine.cpu_seconds`) and the examples trained. Optionally, after the
rounds, each candidate runs the last round again on *empty* client datasets
(state not kept): what that costs is everything but client training
(broadcast, aggregation, server update, serialization, dispatch).
"""

import contextlib
import dataclasses
import statistics
import time
from typing import Callable, Optional, Sequence

from absl import logging
import numpy as np
import tensorflow_federated as tff

from tff_partial.bench import cohorts as cohorts_lib
from tff_partial.bench import machine
from tff_partial.training import loop
from tff_partial.training import method as method_lib


@dataclasses.dataclass
class Candidate:
  """A configuration ready to run; `context`: a TFF context to run it in
  (`worker_settings.local_context`), None for the default one."""
  name: str
  algorithm: str
  built: method_lib.BuiltMethod
  inputs_fn: cohorts_lib.InputsFn
  overrides: dict = dataclasses.field(default_factory=dict)
  context: Optional[object] = None


def _in_context(candidate):
  if candidate.context is None:
    return contextlib.nullcontext()
  return tff.framework.get_context_stack().install(candidate.context)


def median(values) -> Optional[float]:
  return float(statistics.median(values)) if values else None


class _Timings:
  """One candidate's process, state and timings."""

  def __init__(self, candidate: Candidate, task, seed: int,
               counter: cohorts_lib.ExampleCounter):
    self.c = candidate
    self.counter = counter
    process = candidate.built.process
    with _in_context(candidate):
      state = process.initialize()
      try:  # the loop's seeded initial model, the same for every candidate
        state = process.set_model_weights(state, loop.initial_model_weights(task, seed))
        self.initial_model = 'seeded Keras init (loop.initial_model_weights)'
      except Exception as e:  # pylint: disable=broad-except
        self.initial_model = f'process.initialize() ({type(e).__name__})'
    self.state = state
    self.wall, self.cpu, self.data, self.next, self.examples = [], [], [], [], []
    self.empty = []

  def train_round(self, round_num, cohort, timed):
    c0 = machine.cpu_seconds()
    t0 = time.perf_counter()
    values = self.c.inputs_fn(cohort, round_num, False)
    t1 = time.perf_counter()
    with _in_context(self.c):
      self.state = self.c.built.process.next(self.state, values).state
    t2 = time.perf_counter()
    c2 = machine.cpu_seconds()
    logging.info('%s round %d: %.2fs (data %.3fs), %.2f CPU s', self.c.name,
                 round_num, t2 - t0, t1 - t0, c2 - c0)
    if timed:
      self.cpu.append(c2 - c0)
      self.wall.append(t2 - t0)
      self.data.append(t1 - t0)
      self.next.append(t2 - t1)
      self.examples.append(self.counter.cohort(cohort))

  def empty_round(self, round_num, cohort, timed):
    values = self.c.inputs_fn(cohort, round_num, True)
    t0 = time.perf_counter()
    with _in_context(self.c):
      self.c.built.process.next(self.state, values)  # state not kept
    if timed:
      self.empty.append(time.perf_counter() - t0)

  def row(self) -> dict:
    built = self.c.built
    wall, nxt, empty = median(self.wall), median(self.next), median(self.empty)
    client_s = max(0.0, nxt - empty) if empty is not None and nxt is not None else None
    examples = float(np.mean(self.examples)) if self.examples else 0.0
    row = {
        'name': self.c.name, 'algorithm': self.c.algorithm,
        'overrides': {k: str(v) for k, v in self.c.overrides.items()},
        'initial_model': self.initial_model,
        'params_total': built.params_total, 'params_trainable': built.params_trainable,
        'bytes_down_per_client': built.bytes.down_payload,
        'bytes_up_per_client': built.bytes.up_payload,
        'bytes_down_overhead_per_client': built.bytes.down_overhead,
        'bytes_up_overhead_per_client': built.bytes.up_overhead,
        'rounds_timed': len(self.wall),
        'round_seconds_all': self.wall,
        'round_cpu_seconds_all': self.cpu,
        'empty_round_seconds_all': self.empty,
        'median_round_seconds': wall,
        'median_round_cpu_seconds': median(self.cpu),
        'median_data_seconds': median(self.data),
        'median_next_seconds': nxt,
        'median_empty_round_seconds': empty,
        'client_training_seconds': client_s,
        'examples_per_round': examples,
        'examples_per_second': examples / wall if wall else None,
        'client_examples_per_second': examples / client_s if client_s else None,
    }
    if built.bytes_note:
      row['bytes_note'] = built.bytes_note
    return row


def run_interleaved(
    candidates: Sequence[Candidate],
    task,
    round_cohorts: Sequence[Sequence[str]],
    *,
    seed: int,
    warmup: int,
    empty_rounds: int = 0,
    finish_fn: Optional[Callable[[Candidate, object, dict], None]] = None,
    references: Sequence = (),
) -> tuple[list[dict], list[dict]]:
  """Runs the candidates round by round, interleaved; one result row each.

  Args:
    candidates: the configurations, built.
    task: the registry task they train.
    round_cohorts: the clients of each round (the same for every candidate).
    seed: the seed of the initial model (`loop.initial_model_weights`).
    warmup: rounds not timed (tracing, compilation, caches).
    empty_rounds: timed repetitions of the last round on empty datasets
      (after one untimed one that warms that path); 0: none.
    finish_fn: called as finish_fn(candidate, final_state, row) after the
      rounds, to add columns (accuracy, memory) to the row.
    references: centralized references (`references.make_references`), run
      in the same interleaving on the same cohorts.

  Returns:
    (one row per candidate, one row per reference).
  """
  counter = cohorts_lib.ExampleCounter(task)
  timings = [_Timings(c, task, seed, counter) for c in candidates]
  everyone = timings + list(references)

  def rotated(i):
    k = i % len(everyone) if everyone else 0
    return everyone[k:] + everyone[:k]

  for round_num, cohort in enumerate(round_cohorts):
    for t in rotated(round_num):
      t.train_round(round_num, cohort, timed=round_num >= warmup)
  last = len(round_cohorts) - 1
  if empty_rounds:
    for i in range(empty_rounds + 1):  # the first one warms the empty path
      for t in rotated(i):
        t.empty_round(last, round_cohorts[last], timed=i > 0)
  rows = []
  for t in timings:
    row = t.row()
    row['clients_per_round'] = len(round_cohorts[0])
    if finish_fn is not None:
      finish_fn(t.c, t.state, row)
    rows.append(row)
  return rows, [r.row() for r in references]
