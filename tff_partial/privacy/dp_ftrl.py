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
  has no restarts. `DPFTRLSumFactory` is the glue: a `dp_mean.DPSumFactory`
  that takes the specs from the value type it is created for (so the same
  flags work for FedAvg, FedPT's trainable part, PVT and select), and wraps the
  query in tensorflow_privacy's `RestartQuery` with a
  `PeriodicRoundRestartIndicator` so the tree restarts after every pass over the
  population (DP-FTRL's "restart" variant; the accounting in `accounting.py`
  composes one tree per epoch). `DPFTRLFactory` divides its residual sum by
  `clients_per_round` (`tfp.NormalizedQuery`, a fixed-denominator mean).

* Dividing by counts that change from round to round. PVT divides the
  residual SUM of each variable by that round's number of clients that
  trained it (public: masks come from seeds). With the `fixed` scheme the
  count of a trained variable is the same every round, so the residuals still
  telescope exactly. With random masks they do not: the noise reaching the
  model is `sum_t (N_t - N_{t-1}) / c_t`, not `N_t / c`, and a round a
  variable is not trained drops its residual. Privacy is unaffected
  (post-processing of the released residual sums), but the noise on the model
  is no longer the tree's `O(log t)` prefix noise. We chose the per-round
  division anyway: it is PVT's per-variable mean, and it is what the Gaussian
  mechanism gets (see `scripts/methods/pvt.py`).

* The noise seed. By default the tree's noise seed is secret (drawn from the
  operating system when the factory is made; never saved with the run's
  flags). A public `noise_seed` makes simulations reproducible and voids the
  guarantee: whoever knows it can regenerate and subtract the noise.

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
where `result` is the noisy residual divided by `clients_per_round`
(`DPFTRLSumFactory`: the noisy residual sum itself).
"""

import secrets
from typing import Optional

import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_partial.privacy import dp_mean


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


class DPFTRLSumFactory(dp_mean.DPSumFactory):
  """Clip, sum, add tree-aggregation noise residuals: a SUM (no division).

  `tfp.TreeResidualSumQuery` (optionally inside `tfp.RestartQuery`) in
  `tff.aggregators.DifferentiallyPrivateFactory`, built lazily for the value
  type given to `create`. `DPFTRLFactory` divides it by clients_per_round;
  PVT divides it by its per-variable trainer counts (see
  `scripts/methods/pvt.py`).
  """

  def __init__(
      self,
      noise_multiplier: float,
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
      clip_norm: L2 clip of each client's update (the whole structure); > 0.
      restart_period: restart the tree every this many rounds (the rounds of
        one epoch); None never restarts.
      noise_seed: a PUBLIC seed of the noise (reproducible simulations, no
        privacy: whoever knows it can subtract the noise). None (default): a
        secret seed drawn from the operating system's entropy (`secrets`) when
        the factory is made, held only in the aggregator's state.
      use_efficient: Honaker's variance-reduced tree (TFF's default).
      record_aggregation_factory: inner sum of clipped records (default
        `tff.aggregators.SumFactory`), e.g. a secure sum.
    """
    super().__init__(record_aggregation_factory)
    _check_nonnegative(noise_multiplier, 'noise_multiplier')
    _check_positive(clip_norm, 'clip_norm')
    if restart_period is not None and (
        not isinstance(restart_period, int) or restart_period < 1):
      raise ValueError(f'restart_period={restart_period!r} must be an int >= 1 or None')
    self._noise_multiplier = float(noise_multiplier)
    self._clip_norm = float(clip_norm)
    self._restart_period = restart_period
    self.noise_seed_is_public = noise_seed is not None
    # tfp's own default (noise_seed=None) seeds from the clock, which can be
    # guessed from the run's start time; draw the secret from the OS instead.
    self._noise_seed = noise_seed if noise_seed is not None else secrets.randbits(62)
    self._use_efficient = use_efficient

  @property
  def noise_multiplier(self) -> float:
    return self._noise_multiplier

  @property
  def clip_norm(self) -> float:
    return self._clip_norm

  @property
  def restart_period(self) -> Optional[int]:
    return self._restart_period

  def query(self, specs) -> tfp.DPQuery:
    """The tensorflow_privacy sum query for records shaped like `specs`."""
    sum_query = tfp.TreeResidualSumQuery.build_l2_gaussian_query(
        self._clip_norm,
        self._noise_multiplier,
        specs,
        noise_seed=self._noise_seed,
        use_efficient=self._use_efficient,
    )
    if self._restart_period is not None and self._restart_period > 0:
      # warmup=None: the first restart happens after `restart_period` rounds.
      indicator = tfp.restart_query.PeriodicRoundRestartIndicator(
          period=self._restart_period)
      sum_query = tfp.RestartQuery(sum_query, indicator)
    return sum_query


class DPFTRLFactory(dp_mean.DPMeanFactory):
  """Clip, sum, add tree-aggregation noise residuals, divide by clients.

  A FIXED-DENOMINATOR MEAN: `DPFTRLSumFactory` inside `tfp.NormalizedQuery`
  (denominator clients_per_round), the composition TFF's `tree_aggregation`
  preset uses. `sum_factory` is the residual sum without the division.
  """

  def __init__(self, noise_multiplier: float, clients_per_round: int,
               clip_norm: float, restart_period: Optional[int] = None, **kwargs):
    """As `DPFTRLSumFactory` (`noise_seed`, `use_efficient`,
    `record_aggregation_factory` by keyword); `clients_per_round` (> 0) is the
    fixed denominator."""
    _check_positive(clients_per_round, 'clients_per_round')
    super().__init__(
        DPFTRLSumFactory(noise_multiplier, clip_norm, restart_period, **kwargs),
        denominator=clients_per_round)

  @property
  def noise_multiplier(self) -> float:
    return self.sum_factory.noise_multiplier

  @property
  def clip_norm(self) -> float:
    return self.sum_factory.clip_norm

  @property
  def restart_period(self) -> Optional[int]:
    return self.sum_factory.restart_period

  @property
  def noise_seed_is_public(self) -> bool:
    return self.sum_factory.noise_seed_is_public


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
