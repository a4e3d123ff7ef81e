"""How often each variable is trained under PVT: observed against the scheme.

PVT (Yang et al., *Partial Variable Training*, section 3.4 and Tables 5-6)
recovers the accuracy lost to freezing with more clients per round or more
local steps. Whether a run can recover depends first on how often the server
gets an update of each variable at all. The masked mean
(`masked_mean.MaskedMeanFactory`) reports `clients_per_variable` every round
(the exact number of clients that trained each variable), and the training
loop writes it to the run's `metrics.csv` as `aggregator/clients_per_variable`.
This module turns those counts into per-variable statistics and sets them
beside what the scheme predicts:

* clients per round: observed mean; expected `C p` for `C` clients per round
  and a client's probability `p` of training the variable
  (`schemes.MaskSampler.trained_probability`);
* untrained share: rounds in which no client trained it; expected
  `q = (1 - p)^C` under per-client-per-round masks (independent clients) and
  `q = 1 - p` under `per_round`, `fixed` and `biases_only` masks (one choice for
  the whole round);
* staleness: after each round, the number of rounds since the variable's last
  update (0 if it was updated in that round; counted from the initial model
  before its first update); expected `q / (1 - q)` in the steady state
  (geometric gaps), infinite for a variable nobody trains;
* longest gap: the longest run of consecutive rounds without an update.

Written by hand: neither TFF nor the paper's code has such a report. Pure
NumPy over the CSV; no TensorFlow.
"""

import csv
import dataclasses
import json
import math
import os
from typing import Sequence

import numpy as np

COLUMN = 'aggregator/clients_per_variable'
# Schemes whose masks are drawn once per round for all clients (or once).
_SHARED_MASK_SCHEMES = ('per_round', 'fixed', 'biases_only')


class CoverageError(ValueError):
  """The run has no per-variable client counts, or they are inconsistent."""


def read_counts(metrics_csv: str) -> tuple[np.ndarray, np.ndarray]:
  """(rounds int[R], counts int[R, n]) of `aggregator/clients_per_variable`.

  Rows without counts (round 0, the initial evaluation) are skipped; a round
  written twice (a resumed run) keeps its last row. The rounds must be
  consecutive from 1.
  """
  if not os.path.exists(metrics_csv):
    raise CoverageError(f'{metrics_csv} does not exist')
  by_round = {}
  with open(metrics_csv, newline='') as f:
    reader = csv.DictReader(f)
    if COLUMN not in (reader.fieldnames or []):
      raise CoverageError(
          f'{metrics_csv} has no {COLUMN} column: not a --algorithm=pvt run '
          '(or one without the masked mean aggregator)')
    for row in reader:
      if row.get(COLUMN):
        by_round[int(row['round_num'])] = json.loads(row[COLUMN])
  if not by_round:
    raise CoverageError(f'{metrics_csv} has no round with {COLUMN} yet')
  rounds = np.array(sorted(by_round), np.int64)
  if not np.array_equal(rounds, np.arange(1, len(rounds) + 1)):
    raise CoverageError(
        f'{metrics_csv}: rounds with {COLUMN} are not 1..{len(rounds)} '
        f'(first {rounds[0]}, last {rounds[-1]})')
  counts = np.array([by_round[r] for r in rounds], np.int64)
  if counts.ndim != 2:
    raise CoverageError(f'{metrics_csv}: {COLUMN} rows differ in length')
  return rounds, counts


@dataclasses.dataclass(frozen=True)
class Coverage:
  """Per-variable statistics over R rounds (each a float64[n] array)."""

  mean_clients: np.ndarray
  untrained_share: np.ndarray
  mean_staleness: np.ndarray
  longest_gap: np.ndarray


def observed(counts: np.ndarray) -> Coverage:
  """Statistics of counts int[R, n] (rounds 1..R in order)."""
  counts = np.asarray(counts)
  if counts.ndim != 2 or counts.shape[0] == 0:
    raise CoverageError(f'counts must be [rounds, variables], got shape {counts.shape}')
  trained = counts > 0
  num_rounds, n = trained.shape
  staleness = np.zeros([num_rounds, n], np.float64)
  gaps = np.zeros([n], np.float64)
  age = np.zeros([n], np.float64)  # rounds since the last update (round 0: the init)
  run = np.zeros([n], np.float64)
  for r in range(num_rounds):
    age = np.where(trained[r], 0.0, age + 1.0)
    run = np.where(trained[r], 0.0, run + 1.0)
    gaps = np.maximum(gaps, run)
    staleness[r] = age
  return Coverage(
      mean_clients=counts.mean(axis=0).astype(np.float64),
      untrained_share=(~trained).mean(axis=0).astype(np.float64),
      mean_staleness=staleness.mean(axis=0),
      longest_gap=gaps,
  )


def untrained_probability(trained_probability: Sequence[float], clients_per_round: int,
                          scheme: str) -> np.ndarray:
  """Probability that no client of a round trains each variable."""
  p = np.asarray(trained_probability, np.float64)
  if scheme in _SHARED_MASK_SCHEMES:
    return 1.0 - p
  if scheme == 'per_client_per_round':
    return (1.0 - p)**int(clients_per_round)
  raise CoverageError(f'unknown scheme {scheme!r}')


def expected(trained_probability: Sequence[float], clients_per_round: int,
             scheme: str) -> Coverage:
  """What the scheme predicts (staleness in the steady state; no longest gap)."""
  p = np.asarray(trained_probability, np.float64)
  q = untrained_probability(p, clients_per_round, scheme)
  with np.errstate(divide='ignore'):
    staleness = np.where(q < 1.0, q / np.maximum(1.0 - q, 1e-300), math.inf)
  return Coverage(
      mean_clients=int(clients_per_round) * p,
      untrained_share=q,
      mean_staleness=staleness,
      longest_gap=np.full(p.shape, np.nan),
  )
