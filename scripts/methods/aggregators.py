"""--aggregator: the model-update aggregator any method plugs in.

  FLAG_NAMES, validate_flags(algorithm), and
  build(task, clients_per_round, total_rounds, server_optimizer) -> AggregatorChoice.

`mean` keeps each method's default weighted mean. `dp_ftrl` (Kairouz et al.
2021), `dp_gaussian` (DP-FedAvg, McMahan et al. 2018) and `median` (Yin et al.
2018) return an *unweighted* factory from `tff_partial.privacy`; every method
must then aggregate its client updates with it unweighted (docs/privacy.md).
`AggregatorChoice.statistic` says what the factory computes: the DP ones a
fixed-denominator mean (`privacy.DPMeanFactory`, whose `sum_factory` is the
same mechanism as a sum, for methods that divide by their own public counts:
PVT), the median a robust statistic. docs/privacy.md has the matrix of
methods x aggregators.

Noise seed: DP noise is secret by default (a seed from the operating system,
never saved with the run). `--dp_noise_seed` makes it reproducible for
simulations, and every epsilon printed then carries `PRIVACY_NOTE`.

DP-FTRL's server update is built from --server_optimizer (sgd or sgdm),
--server_learning_rate and --server_momentum. Measured on the FEMNIST sample
(docs/privacy.md): server SGD lr 1.0 without momentum (the flags' defaults)
learns like FedAvg in 20 rounds; momentum 0.9 stalls at ~5% for 20 rounds at
server lr 0.1, 0.3 and 1.0.
"""

import dataclasses
from typing import Callable, Optional, Sequence

from absl import flags
import tensorflow_federated as tff

from scripts import flag_groups
from tff_partial import privacy
from tff_partial.privacy import accounting
from tff_partial.privacy import statistics
from tff_partial.training import method

AGGREGATORS = ('mean', 'dp_ftrl', 'dp_gaussian', 'median')
DP_AGGREGATORS = ('dp_ftrl', 'dp_gaussian')
# Server optimizers DP-FTRL's FTRL-with-momentum update can be written as.
DP_FTRL_SERVER_OPTIMIZERS = ('sgd', 'sgdm')
# Federated select key policies whose keys do not depend on client data.
SELECT_POLICIES_UNDER_DP = ('random',)

# Printed with every epsilon of a run whose DP noise seed is public.
PRIVACY_NOTE = 'noise seed public: no privacy guarantee'

_AGGREGATOR = flags.DEFINE_enum(
    'aggregator', 'mean', AGGREGATORS,
    'How client model updates are aggregated. mean: the method\'s weighted '
    'mean (PVT: per variable over its trainers; select: per key over the '
    'clients that chose it). median: coordinate-wise median (PVT: over the '
    'variable\'s trainers; select: over the key\'s choosers). dp_gaussian, '
    'dp_ftrl: clip, noise the sum, divide by clients_per_round (PVT: by each '
    'variable\'s public trainer count; select: the paper\'s eq. 5 over all '
    'clients_per_round clients, so steps are about m/K of mean\'s). '
    'Matrix: docs/privacy.md.')
NOISE_MULTIPLIER = flags.DEFINE_float(
    'noise_multiplier', 1.0,
    'DP: Gaussian noise std / --clip_norm (per tree node for dp_ftrl). 0 = no noise.')
CLIP_NORM = flags.DEFINE_float(
    'clip_norm', 0.3, 'DP: L2 clip of each client update (initial clip with --dp_adaptive_clip).')
TARGET_DELTA = flags.DEFINE_float(
    'target_delta', None,
    'DP: delta of the reported (epsilon, delta); default 1/population.')
DP_ADAPTIVE_CLIP = flags.DEFINE_bool(
    'dp_adaptive_clip', False,
    'dp_gaussian: adapt the clip to the median update norm (Andrew et al. 2021).')
DP_SAMPLING = flags.DEFINE_enum(
    'dp_sampling', 'without_replacement', accounting.SAMPLINGS,
    'dp_gaussian accounting. Default: fixed-size sampling without replacement '
    '(replace-one), which is what the training loop does. poisson: Poisson '
    'sampling with q=clients_per_round/population (McMahan et al. 2018), an '
    'approximation for this loop that reports a smaller epsilon.')
DP_FTRL_RESTART = flags.DEFINE_bool(
    'dp_ftrl_restart', True,
    'dp_ftrl: restart the tree after every epoch (population // clients_per_round rounds).')

DP_NOISE_SEED = flags.DEFINE_integer(
    'dp_noise_seed', None,
    'DP (simulations only): a public seed of the DP noise, for reproducible '
    'runs. Anyone who knows it can subtract the noise: every epsilon printed '
    f'then says "{PRIVACY_NOTE}". Default: secret noise (a seed from the OS, '
    'not saved with the run).')

FLAG_NAMES = ('noise_multiplier', 'clip_norm', 'target_delta', 'dp_adaptive_clip',
              'dp_sampling', 'dp_ftrl_restart', 'dp_noise_seed')
_FLAGS_OF = {
    'dp_ftrl': ('noise_multiplier', 'clip_norm', 'target_delta', 'dp_ftrl_restart',
                'dp_noise_seed'),
    'dp_gaussian': ('noise_multiplier', 'clip_norm', 'target_delta', 'dp_adaptive_clip',
                    'dp_sampling', 'dp_noise_seed'),
    'median': (),
    'mean': (),
}


@dataclasses.dataclass(frozen=True)
class AggregatorChoice:
  """factory: None means the method's default weighted mean.

  statistic: what `factory` computes, from `tff_partial.privacy.statistics`:
    WEIGHTED_MEAN (`mean`: factory None, each method's own weighted mean),
    FIXED_DENOMINATOR_MEAN (dp_*: `privacy.DPMeanFactory`, (clipped sum +
    noise) / clients_per_round; its `sum_factory` is the same mechanism as a
    sum, for methods that divide by their own public counts) or MEDIAN.
  privacy_note: None, or `PRIVACY_NOTE` when the DP noise seed is public
    (--dp_noise_seed): to print with every epsilon.

  server_optimizer: replaces the flag-built server optimizer when the mechanism
    needs its own (DP-FTRL); None keeps it.
  epsilon_fn: rounds completed -> epsilon at --target_delta; None without DP.
  target_delta: the delta of `epsilon_fn`; None without DP.
  client_indices_fn: round number (from 1) -> indices into
    `task.train_data.client_ids` of that round's clients, when the mechanism's
    guarantee needs a particular sampling (DP-FTRL: each client at most once
    per epoch); None means the loop's own uniform sampling.
  """

  factory: Optional[method.AggregationFactory] = None
  statistic: str = statistics.WEIGHTED_MEAN
  privacy_note: Optional[str] = None
  server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None
  epsilon_fn: Optional[Callable[[int], float]] = None
  target_delta: Optional[float] = None
  client_indices_fn: Optional[Callable[[int], Sequence[int]]] = None


def _given(name: str) -> bool:
  """The flag was set on the command line (or by a test's flagsaver)."""
  holder = flags.FLAGS[name]
  return bool(holder.present) or not holder.using_default_value


def validate_flags(algorithm: str) -> None:
  """Rejects flags that do not apply to --aggregator and bad DP values."""
  name = _AGGREGATOR.value
  for flag_name in FLAG_NAMES:
    if _given(flag_name) and flag_name not in _FLAGS_OF[name]:
      users = [a for a, names in _FLAGS_OF.items() if flag_name in names]
      raise flag_groups.FlagError(
          f'--{flag_name} applies only to --aggregator={"/".join(users)}, '
          f'not to --aggregator={name}')
  if name not in DP_AGGREGATORS:
    return
  if DP_NOISE_SEED.value is not None and DP_ADAPTIVE_CLIP.value:
    raise flag_groups.FlagError(
        '--dp_noise_seed cannot be used with --dp_adaptive_clip: TFF\'s adaptive '
        'clip draws its clipped-count noise from an unseeded source')
  if DP_ADAPTIVE_CLIP.value and flag_groups.DETERMINISTIC.value:
    raise flag_groups.FlagError(
        '--dp_adaptive_clip needs --nodeterministic: TFF\'s adaptive clip draws '
        'its noise from unseeded random ops, which op determinism refuses')
  if NOISE_MULTIPLIER.value is None or NOISE_MULTIPLIER.value < 0:
    raise flag_groups.FlagError(
        f'--noise_multiplier={NOISE_MULTIPLIER.value} must be >= 0')
  if CLIP_NORM.value is None or CLIP_NORM.value <= 0:
    raise flag_groups.FlagError(f'--clip_norm={CLIP_NORM.value} must be > 0')
  delta = TARGET_DELTA.value
  if delta is not None and not 0.0 < delta < 1.0:
    raise flag_groups.FlagError(f'--target_delta={delta} must be in (0, 1)')
  if (algorithm == 'select' and 'select_policy' in flags.FLAGS
      and flags.FLAGS['select_policy'].value not in SELECT_POLICIES_UNDER_DP):
    raise flag_groups.FlagError(
        f'--aggregator={name} with --algorithm=select needs --select_policy in '
        f'{{{",".join(SELECT_POLICIES_UNDER_DP)}}}: keys chosen from a client\'s data '
        f'(--select_policy={flags.FLAGS["select_policy"].value}) reveal which rows its '
        'data touches, and the DP noise does not cover them (docs/privacy.md)')
  if name == 'dp_ftrl':
    server_opt = flags.FLAGS['server_optimizer'].value
    if server_opt not in DP_FTRL_SERVER_OPTIMIZERS:
      raise flag_groups.FlagError(
          f'--aggregator=dp_ftrl needs --server_optimizer in '
          f'{{{",".join(DP_FTRL_SERVER_OPTIMIZERS)}}} (FTRL with momentum is SGD '
          f'with momentum on the tree residuals); got --server_optimizer={server_opt}')


def _dp_ftrl_server_optimizer() -> tff.learning.optimizers.Optimizer:
  fl = flags.FLAGS
  momentum = fl['server_momentum'].value if fl['server_optimizer'].value == 'sgdm' else 0.0
  return privacy.build_dp_ftrl_server_optimizer(fl['server_learning_rate'].value, momentum)


def build(task, clients_per_round: int, total_rounds: int,
          server_optimizer) -> AggregatorChoice:
  """The aggregator selected by the flags, for a task and a planned run."""
  del server_optimizer  # DP-FTRL builds its own from the --server_* flags
  name = _AGGREGATOR.value
  if name == 'mean':
    return AggregatorChoice()
  if name == 'median':
    return AggregatorChoice(factory=privacy.build_median_factory(),
                            statistic=statistics.MEDIAN)

  population = task.population
  if not 1 <= clients_per_round <= population:
    raise flag_groups.FlagError(
        f'--clients_per_round={clients_per_round} must be in [1, population={population}] '
        f'for --aggregator={name}')
  delta = TARGET_DELTA.value if TARGET_DELTA.value is not None else 1.0 / population
  if not 0.0 < delta < 1.0:
    raise flag_groups.FlagError(
        f'--target_delta defaults to 1/population={delta}, which is not in (0, 1); set it')
  noise = float(NOISE_MULTIPLIER.value)
  clip = float(CLIP_NORM.value)
  seed = flags.FLAGS['seed'].value  # the epoch order of clients (public is fine)
  noise_seed = DP_NOISE_SEED.value  # None: secret noise
  dp = dict(statistic=statistics.FIXED_DENOMINATOR_MEAN, target_delta=delta,
            privacy_note=PRIVACY_NOTE if noise_seed is not None else None)

  if name == 'dp_ftrl':
    restart = DP_FTRL_RESTART.value
    epoch = privacy.rounds_per_epoch(population, clients_per_round)
    if not restart and total_rounds > epoch:
      raise flag_groups.FlagError(
          f'--nodp_ftrl_restart allows at most one epoch ({epoch} rounds of '
          f'{clients_per_round} out of {population} clients); --total_rounds={total_rounds}')
    try:
      factory = privacy.build_dp_ftrl_factory(
          noise_multiplier=noise, clients_per_round=clients_per_round, clip_norm=clip,
          population=population, restart=restart, noise_seed=noise_seed)
      server_opt = _dp_ftrl_server_optimizer()
    except ValueError as e:
      raise flag_groups.FlagError(f'--aggregator=dp_ftrl: {e}') from e

    def epsilon_fn(rounds: int) -> float:
      return accounting.dp_ftrl_epsilon(
          noise, rounds, clients_per_round, population, delta, restart=restart)

    return AggregatorChoice(
        factory=factory, server_optimizer=server_opt, epsilon_fn=epsilon_fn,
        client_indices_fn=privacy.build_epoch_sampler(population, clients_per_round, seed),
        **dp)

  try:
    factory = privacy.build_dp_gaussian_factory(
        noise_multiplier=noise, clients_per_round=clients_per_round, clip_norm=clip,
        adaptive_clip=DP_ADAPTIVE_CLIP.value, noise_seed=noise_seed)
  except ValueError as e:
    raise flag_groups.FlagError(f'--aggregator=dp_gaussian: {e}') from e
  sampling = DP_SAMPLING.value

  def epsilon_fn(rounds: int) -> float:  # pylint: disable=function-redefined
    return accounting.dp_fedavg_epsilon(
        noise, rounds, clients_per_round, population, delta, sampling=sampling)

  return AggregatorChoice(factory=factory, epsilon_fn=epsilon_fn, **dp)
