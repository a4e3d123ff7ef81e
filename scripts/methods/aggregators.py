"""--aggregator: the model-update aggregator any method plugs in.

  FLAG_NAMES, validate_flags(algorithm), and
  build(task, clients_per_round, total_rounds, server_optimizer) -> AggregatorChoice.
"""

import dataclasses
from typing import Callable, Optional

from absl import flags
import tensorflow_federated as tff

from scripts import flag_groups
from tff_partial.training import method

AGGREGATORS = ('mean', 'dp_ftrl', 'dp_gaussian', 'median')

_AGGREGATOR = flags.DEFINE_enum(
    'aggregator', 'mean', AGGREGATORS, 'How client model updates are aggregated.'
)

FLAG_NAMES = ()  # flags that only DP aggregators accept (filled by the privacy issue)


@dataclasses.dataclass(frozen=True)
class AggregatorChoice:
  """factory: None means the method's default weighted mean.

  server_optimizer: replaces the flag-built server optimizer when the mechanism
    needs its own (DP-FTRL); None keeps it.
  epsilon_fn: rounds completed -> epsilon at --target_delta; None without DP.
  """

  factory: Optional[method.AggregationFactory] = None
  server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None
  epsilon_fn: Optional[Callable[[int], float]] = None


def validate_flags(algorithm: str) -> None:
  del algorithm
  if _AGGREGATOR.value != 'mean':
    raise flag_groups.FlagError(
        f'--aggregator={_AGGREGATOR.value} is not implemented yet; valid values: mean'
    )


def build(task, clients_per_round: int, total_rounds: int,
          server_optimizer) -> AggregatorChoice:
  del task, clients_per_round, total_rounds, server_optimizer
  return AggregatorChoice()
