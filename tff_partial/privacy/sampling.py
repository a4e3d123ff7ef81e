"""Client order for DP-FTRL: each client at most once per epoch.

DP-FTRL's guarantee (Kairouz et al. 2021, Sec. 4 and App. D; the
`SingleEpochTreeAggregationDpEvent` of dp_accounting) needs every client to
contribute at most once to each tree. With the tree restarted every
`population // clients_per_round` rounds, that holds when clients are taken
from a permutation of the population, a fresh one per epoch. Uniform sampling
per round (FedAvg's usual) can pick a client twice within an epoch and voids the
reported epsilon.

The permutation of epoch e is drawn from `numpy.random.default_rng([seed, e])`,
so the clients of any round follow from (seed, round) alone and a resumed run
samples exactly what an uninterrupted one would.
"""

import numpy as np

from tff_partial.privacy import dp_ftrl


def build_epoch_sampler(population: int, clients_per_round: int, seed: int):
  """Returns `client_indices(round_num) -> np.ndarray` of `clients_per_round`
  distinct indices in [0, population); rounds are numbered from 1.

  Within an epoch of `population // clients_per_round` rounds no index repeats;
  the `population % clients_per_round` clients left over at the end of a
  permutation sit that epoch out.
  """
  per_epoch = dp_ftrl.rounds_per_epoch(population, clients_per_round)

  def client_indices(round_num: int) -> np.ndarray:
    if round_num < 1:
      raise ValueError(f'round_num={round_num} must be >= 1')
    epoch, position = divmod(round_num - 1, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(population)
    return order[position * clients_per_round:(position + 1) * clients_per_round]

  return client_indices
