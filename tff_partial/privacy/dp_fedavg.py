"""DP-FedAvg: per-client L2 clipping and Gaussian noise on the sum.

McMahan, Ramage, Talwar, Zhang (2018), "Learning Differentially Private Recurrent
Language Models", https://arxiv.org/abs/1710.06963, as compared with FedAvg in
"Salvaging Federated Learning by Local Adaptation" (Yu, Bagdasaryan, Shmatikov).
Adaptive clipping: Andrew, Thakkar, McMahan, Ramaswamy (2021),
https://arxiv.org/abs/1905.03871.

Thin validated wrappers over TFF's presets
`tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed` /
`gaussian_adaptive` (tensorflow_privacy's `GaussianSumQuery` /
`QuantileAdaptiveClipSumQuery` inside a `NormalizedQuery` with the fixed
denominator `clients_per_round`). Federated type for a value type `V`:
  next: `(<S@SERVER, {V}@CLIENTS> -> <state=S@SERVER, result=V@SERVER, measurements@SERVER>)`
with `result = (sum_i clip(v_i) + N(0, (clip * noise_multiplier)^2 I)) / clients_per_round`.
"""

import tensorflow_federated as tff

from tff_partial.privacy import dp_ftrl


def build_dp_gaussian_factory(
    noise_multiplier: float,
    clients_per_round: int,
    clip_norm: float,
    adaptive_clip: bool = False,
    target_unclipped_quantile: float = 0.5,
) -> tff.aggregators.UnweightedAggregationFactory:
  """DP-FedAvg's aggregator.

  Args:
    noise_multiplier: Gaussian noise std / clip norm; >= 0.
    clients_per_round: fixed denominator of the mean; > 0.
    clip_norm: the fixed clip, or the initial clip when `adaptive_clip`; > 0.
    adaptive_clip: adapt the clip to `target_unclipped_quantile` of the update
      norms (TFF's geometric update). `noise_multiplier` is then the total
      effective multiplier, part of which TFF spends on the noisy clipped count.
    target_unclipped_quantile: in [0, 1], only with `adaptive_clip`.
  """
  dp_ftrl._check_nonnegative(noise_multiplier, 'noise_multiplier')  # pylint: disable=protected-access
  dp_ftrl._check_positive(clients_per_round, 'clients_per_round')  # pylint: disable=protected-access
  dp_ftrl._check_positive(clip_norm, 'clip_norm')  # pylint: disable=protected-access
  if adaptive_clip:
    if not 0.0 <= target_unclipped_quantile <= 1.0:
      raise ValueError(
          f'target_unclipped_quantile={target_unclipped_quantile} must be in [0, 1]')
    # TFF spends part of the budget on the clipped count with noise std
    # 0.05 * clients_per_round; that is impossible unless z < 0.1 * clients.
    if noise_multiplier >= 0.1 * clients_per_round:
      raise ValueError(
          f'adaptive clipping needs noise_multiplier < 0.1 * clients_per_round; got '
          f'noise_multiplier={noise_multiplier}, clients_per_round={clients_per_round}')
    return tff.aggregators.DifferentiallyPrivateFactory.gaussian_adaptive(
        noise_multiplier=float(noise_multiplier),
        clients_per_round=float(clients_per_round),
        initial_l2_norm_clip=float(clip_norm),
        target_unclipped_quantile=float(target_unclipped_quantile),
    )
  return tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
      noise_multiplier=float(noise_multiplier),
      clients_per_round=float(clients_per_round),
      clip=float(clip_norm),
  )
