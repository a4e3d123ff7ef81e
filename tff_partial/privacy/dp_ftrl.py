"""DP-FTRL: tree-aggregation noise on client updates, FTRL-with-momentum server.

Kairouz, McMahan, Song, Thakkar, Thakurta, Xu (2021), "Practical and Private
(Deep) Learning without Sampling or Shuffling", https://arxiv.org/abs/2103.00039,
as used by FedPT (Sections 3.2 and 4.2: Stack Overflow, clip 0.3, server
momentum 0.9, 100 clients per round).

What the libraries give and what this module adds:

* tensorflow_privacy's `TreeResidualSumQuery` clips every client update to L2
  norm `clip_norm`, sums them and adds the *residual* of tree-aggregation noise:
  round t releases `x_t + N_t - N_{t-1}`, where `N_t` is the tree's noise on the
  prefix sum of rounds 1..t. So the released residuals `r_t` telescope to the
  noisy cumulative sums `S_t = sum_{k<=t} x_k + N_t` of DP-FTRL.
  `tff.aggregators.DifferentiallyPrivateFactory.tree_aggregation` wraps that query
  (divided by `clients_per_round`), but it needs the record specs up front and
  has no restarts. `DPFTRLFactory` is the glue: an
  `UnweightedAggregationFactory` that takes the specs from the value type it is
  created for (so the same flags work for FedAvg, FedPT's trainable part, PVT
  and select), and wraps the query in tensorflow_privacy's `RestartQuery` with a
  `PeriodicRoundRestartIndicator` so the tree restarts after every pass over the
  population (DP-FTRL's "restart" variant; the accounting in `accounting.py`
  composes one tree per epoch).

* The server update. DP-FTRL with momentum (Kairouz et al., Alg. 1 with
  momentum) keeps `m_t = gamma * m_{t-1} + S_t` and sets
  `theta_t = theta_0 - lr * m_t`. TFF's SGD with momentum on the residuals keeps
  `a_t = gamma * a_{t-1} + r_t` and sets `theta_t = theta_{t-1} - lr * a_t`.
  Both give `theta_t = theta_0 - lr * sum_{j<=t} r_j (1 - gamma^{t-j+1})/(1 - gamma)`
  (swap the order of the double sum), so with zero initial momentum they are the
  same algorithm; `tests/dp_ftrl_test.py` checks it numerically. We therefore
  use `tff.learning.optimizers.build_sgdm` on the residuals and write no
  optimizer. At a restart the tree noise starts from zero again, which equals
  FTRL restarted from the current model; the momentum buffer is carried over
  (post-processing, so privacy is unaffected).

Federated type of the aggregation process for a value type `V`
(`DPFTRLFactory().create(V)`):
  initialize: `( -> <query_state, agg_state, dp_event, is_init_state>@SERVER)`
  next: `(<S@SERVER, {V}@CLIENTS> -> <state=S@SERVER, result=V@SERVER,
          measurements=<dp_query_metrics, dp>@SERVER>)`
where `result` is the noisy residual divided by `clients_per_round`.
"""

from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp
# TFF's own DifferentiallyPrivateFactory converts value types to specs with this
# function; the query must see exactly the same structure.
from tensorflow_federated.python.core.impl.types import type_conversions


def _check_nonnegative(value, name):
  if not isinstance(value, (int, float)) or value < 0:
    raise ValueError(f'{name}={value!r} must be a number >= 0')


def _check_positive(value, name):
  if not isinstance(value, (int, float)) or value <= 0:
    raise ValueError(f'{name}={value!r} must be a number > 0')


def rounds_per_epoch(population: int, clients_per_round: int) -> int:
  """Rounds in one pass over the population (each client at most once)."""
  if population < 1:
    raise ValueError(f'population={population} must be >= 1')
  if clients_per_round < 1 or clients_per_round > population:
    raise ValueError(
        f'clients_per_round={clients_per_round} must be in [1, population={population}]')
  return population // clients_per_round


class DPFTRLFactory(tff.aggregators.UnweightedAggregationFactory):
  """Clip, sum, add tree-aggregation noise residuals, divide by clients.

  Wraps `tff.aggregators.DifferentiallyPrivateFactory` around
  `tfp.TreeResidualSumQuery` (optionally inside `tfp.RestartQuery`) and
  `tfp.NormalizedQuery`, the composition TFF's `tree_aggregation` preset uses,
  built lazily for the value type given to `create`.
  """

  def __init__(
      self,
      noise_multiplier: float,
      clients_per_round: int,
      clip_norm: float,
      restart_period: Optional[int] = None,
      noise_seed: Optional[int] = None,
      use_efficient: bool = True,
      record_aggregation_factory: Optional[
          tff.aggregators.UnweightedAggregationFactory] = None,
  ):
    """Validates the arguments.

    Args:
      noise_multiplier: std of the noise at each tree node / `clip_norm`; >= 0.
      clients_per_round: the fixed denominator of the mean; > 0.
      clip_norm: L2 clip of each client's update (the whole structure); > 0.
      restart_period: restart the tree every this many rounds (the rounds of
        one epoch); None never restarts.
      noise_seed: seed of the noise generator (None: from the clock).
      use_efficient: Honaker's variance-reduced tree (TFF's default).
      record_aggregation_factory: inner sum of clipped records (default
        `tff.aggregators.SumFactory`), e.g. a secure sum.
    """
    _check_nonnegative(noise_multiplier, 'noise_multiplier')
    _check_positive(clients_per_round, 'clients_per_round')
    _check_positive(clip_norm, 'clip_norm')
    if restart_period is not None and (
        not isinstance(restart_period, int) or restart_period < 1):
      raise ValueError(f'restart_period={restart_period!r} must be an int >= 1 or None')
    self._noise_multiplier = float(noise_multiplier)
    self._clients_per_round = float(clients_per_round)
    self._clip_norm = float(clip_norm)
    self._restart_period = restart_period
    self._noise_seed = noise_seed
    self._use_efficient = use_efficient
    self._record_aggregation_factory = record_aggregation_factory

  @property
  def noise_multiplier(self) -> float:
    return self._noise_multiplier

  @property
  def clip_norm(self) -> float:
    return self._clip_norm

  @property
  def restart_period(self) -> Optional[int]:
    return self._restart_period

  def query(self, record_specs) -> tfp.DPQuery:
    """The tensorflow_privacy query for records shaped like `record_specs`."""
    sum_query = tfp.TreeResidualSumQuery.build_l2_gaussian_query(
        self._clip_norm,
        self._noise_multiplier,
        record_specs,
        noise_seed=self._noise_seed,
        use_efficient=self._use_efficient,
    )
    if self._restart_period is not None and self._restart_period > 0:
      # warmup=None: the first restart happens after `restart_period` rounds.
      indicator = tfp.restart_query.PeriodicRoundRestartIndicator(
          period=self._restart_period)
      sum_query = tfp.RestartQuery(sum_query, indicator)
    return tfp.NormalizedQuery(sum_query, denominator=self._clients_per_round)

  def create(self, value_type) -> tff.templates.AggregationProcess:
    record_specs = type_conversions.type_to_tf_tensor_specs(value_type)
    for spec in tf.nest.flatten(record_specs):
      if not spec.dtype.is_floating:
        raise ValueError(
            f'DP-FTRL aggregates floating-point updates; got {spec.dtype} in {value_type}')
    inner = tff.aggregators.DifferentiallyPrivateFactory(
        self.query(record_specs),
        record_aggregation_factory=self._record_aggregation_factory)
    return inner.create(value_type)


def build_dp_ftrl_factory(
    noise_multiplier: float,
    clients_per_round: int,
    clip_norm: float,
    population: Optional[int] = None,
    restart: bool = True,
    noise_seed: Optional[int] = None,
) -> DPFTRLFactory:
  """DP-FTRL aggregator; restarts the tree every epoch when `restart`.

  With `restart`, an epoch is `population // clients_per_round` rounds, so each
  client contributes at most once to each tree when clients are sampled
  without replacement within an epoch (see `sampling.py`).
  """
  period = None
  if restart:
    if population is None:
      raise ValueError('population is required when restart=True')
    period = rounds_per_epoch(population, clients_per_round)
  return DPFTRLFactory(
      noise_multiplier=noise_multiplier,
      clients_per_round=clients_per_round,
      clip_norm=clip_norm,
      restart_period=period,
      noise_seed=noise_seed,
  )


def build_dp_ftrl_server_optimizer(
    learning_rate: float, momentum: float = 0.9
) -> tff.learning.optimizers.Optimizer:
  """The FTRL-with-momentum server update, as SGD-momentum on residuals.

  Exact for the residual outputs of `DPFTRLFactory` (see the module docstring);
  TFF's SGD applies `theta -= lr * a` to the model *delta* aggregate, whose sign
  TFF already flips (the client update is `initial - trained`).
  """
  _check_positive(learning_rate, 'server_learning_rate')
  if not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
    raise ValueError(f'server_momentum={momentum!r} must be in [0, 1)')
  return tff.learning.optimizers.build_sgdm(
      learning_rate=learning_rate, momentum=momentum if momentum > 0 else None)
