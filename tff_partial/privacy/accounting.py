"""Privacy accounting with `dp_accounting` (0.4.3): events in, epsilon out.

No RDP formula is written here: each mechanism is described as a
`dp_accounting.DpEvent` and `dp_accounting.rdp.RdpAccountant` computes epsilon
at a target delta under the neighbouring relation the event needs.

* DP-FTRL (Kairouz et al. 2021, https://arxiv.org/abs/2103.00039): user-level
  "replace with a special (zero) record" neighbours (`REPLACE_SPECIAL`, their
  Definition 1.1). One epoch = `population // clients_per_round` rounds in which
  every client contributes at most once; the tree restarts after each epoch.
  One epoch is `SingleEpochTreeAggregationDpEvent(z, rounds_in_epoch)`; several
  epochs (a client in several trees, at most once per tree) are the composition
  of one such event per tree, as the event's docstring prescribes.
* DP-FedAvg (McMahan et al. 2018, https://arxiv.org/abs/1710.06963): per round a
  Gaussian sum query with noise multiplier z on a sample of clients, composed
  over rounds:
    - `poisson`: `PoissonSampledDpEvent(q=clients_per_round/population,
      GaussianDpEvent(z))`, add-or-remove-one neighbours (the analysis of
      McMahan et al., an approximation when the cohort size is fixed);
    - `without_replacement`: `SampledWithoutReplacementDpEvent(population,
      clients_per_round, GaussianDpEvent(z / 2))`, replace-one neighbours.
      Replacing one client moves the clipped sum by up to 2 * clip, so the
      noise is z/2 times that sensitivity.
"""

import math
from typing import Optional

import dp_accounting

from tff_partial.privacy import dp_ftrl

SAMPLINGS = ('poisson', 'without_replacement')
_REL = dp_accounting.NeighboringRelation


def _check_common(noise_multiplier, rounds, target_delta=None):
  if not isinstance(noise_multiplier, (int, float)) or noise_multiplier < 0:
    raise ValueError(f'noise_multiplier={noise_multiplier!r} must be >= 0')
  if not isinstance(rounds, int) or rounds < 0:
    raise ValueError(f'rounds={rounds!r} must be an integer >= 0')
  if target_delta is not None and not 0.0 < target_delta < 1.0:
    raise ValueError(f'target_delta={target_delta!r} must be in (0, 1)')


def dp_ftrl_event(
    noise_multiplier: float,
    rounds: int,
    clients_per_round: int,
    population: int,
    restart: bool = True,
) -> dp_accounting.DpEvent:
  """The DP event of `rounds` DP-FTRL rounds (tree restarted every epoch)."""
  _check_common(noise_multiplier, rounds)
  epoch = dp_ftrl.rounds_per_epoch(population, clients_per_round)
  if rounds == 0:
    return dp_accounting.NoOpDpEvent()
  if not restart and rounds > epoch:
    raise ValueError(
        f'rounds={rounds} exceeds one epoch ({epoch} rounds of {clients_per_round} '
        f'out of {population} clients): a client would appear twice in one tree, '
        'which dp_accounting cannot account; use restart=True')
  full_epochs, rest = divmod(rounds, epoch)
  events = []
  if full_epochs:
    events.append(dp_accounting.SelfComposedDpEvent(
        dp_accounting.SingleEpochTreeAggregationDpEvent(float(noise_multiplier), epoch),
        full_epochs))
  if rest:
    events.append(
        dp_accounting.SingleEpochTreeAggregationDpEvent(float(noise_multiplier), rest))
  return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)


def dp_fedavg_event(
    noise_multiplier: float,
    rounds: int,
    clients_per_round: int,
    population: int,
    sampling: str = 'poisson',
) -> dp_accounting.DpEvent:
  """The DP event of `rounds` DP-FedAvg rounds with the given client sampling."""
  _check_common(noise_multiplier, rounds)
  if sampling not in SAMPLINGS:
    raise ValueError(f'sampling={sampling!r}; valid values: {", ".join(SAMPLINGS)}')
  if population < 1 or not 1 <= clients_per_round <= population:
    raise ValueError(
        f'clients_per_round={clients_per_round} must be in [1, population={population}]')
  if rounds == 0:
    return dp_accounting.NoOpDpEvent()
  if sampling == 'poisson':
    per_round = dp_accounting.PoissonSampledDpEvent(
        clients_per_round / population,
        dp_accounting.GaussianDpEvent(float(noise_multiplier)))
  else:
    per_round = dp_accounting.SampledWithoutReplacementDpEvent(
        population, clients_per_round,
        dp_accounting.GaussianDpEvent(float(noise_multiplier) / 2.0))
  return dp_accounting.SelfComposedDpEvent(per_round, rounds)


def neighboring_relation(mechanism: str, sampling: str = 'poisson'):
  """The neighbouring relation under which the mechanism's event is accounted."""
  if mechanism == 'dp_ftrl':
    return _REL.REPLACE_SPECIAL
  if mechanism == 'dp_gaussian':
    return _REL.ADD_OR_REMOVE_ONE if sampling == 'poisson' else _REL.REPLACE_ONE
  raise ValueError(f'mechanism={mechanism!r}; valid values: dp_ftrl, dp_gaussian')


def epsilon_of_event(event: dp_accounting.DpEvent, relation, target_delta: float) -> float:
  """dp_accounting's RDP epsilon of `event` at `target_delta` (inf without noise)."""
  if not 0.0 < target_delta < 1.0:
    raise ValueError(f'target_delta={target_delta!r} must be in (0, 1)')
  if isinstance(event, dp_accounting.NoOpDpEvent):
    return 0.0
  accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=relation)
  accountant.compose(event)
  eps = accountant.get_epsilon(target_delta)
  return float(eps) if math.isfinite(eps) else math.inf


def dp_ftrl_epsilon(noise_multiplier, rounds, clients_per_round, population,
                    target_delta, restart: bool = True) -> float:
  _check_common(noise_multiplier, rounds, target_delta)
  event = dp_ftrl_event(noise_multiplier, rounds, clients_per_round, population, restart)
  return epsilon_of_event(event, neighboring_relation('dp_ftrl'), target_delta)


def dp_fedavg_epsilon(noise_multiplier, rounds, clients_per_round, population,
                      target_delta, sampling: str = 'without_replacement') -> float:
  _check_common(noise_multiplier, rounds, target_delta)
  event = dp_fedavg_event(noise_multiplier, rounds, clients_per_round, population, sampling)
  return epsilon_of_event(event, neighboring_relation('dp_gaussian', sampling), target_delta)


def epsilon(mechanism: str, noise_multiplier: float, rounds: int, clients_per_round: int,
            population: int, target_delta: float, sampling: Optional[str] = None) -> float:
  """Epsilon of `mechanism` in {'dp_ftrl', 'dp_gaussian'} after `rounds` rounds."""
  if mechanism == 'dp_ftrl':
    return dp_ftrl_epsilon(noise_multiplier, rounds, clients_per_round, population, target_delta)
  if mechanism == 'dp_gaussian':
    return dp_fedavg_epsilon(noise_multiplier, rounds, clients_per_round, population,
                             target_delta, sampling or 'poisson')
  raise ValueError(f'mechanism={mechanism!r}; valid values: dp_ftrl, dp_gaussian')
