"""DP-FedAvg: per-client L2 clipping and Gaussian noise on the sum.

McMahan, Ramage, Talwar, Zhang (2018), "Learning Differentially Private Recurrent
Language Models", https://arxiv.org/abs/1710.06963, as compared with FedAvg in
"Salvaging Federated Learning by Local Adaptation" (Yu, Bagdasaryan, Shmatikov).
Adaptive clipping: Andrew, Thakkar, McMahan, Ramaswamy (2021),
https://arxiv.org/abs/1905.03871.

The queries of TFF's presets `tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed`
/ `gaussian_adaptive` (tensorflow_privacy's `GaussianSumQuery` /
`QuantileAdaptiveClipSumQuery`), as a `dp_mean.DPSumFactory` (`GaussianSumFactory`:
the clipped sum plus noise) and, divided by the fixed denominator
`clients_per_round` (`tfp.NormalizedQuery`, as the presets do), a
`dp_mean.DPMeanFactory`. Federated type for a value type `V`:
  next: `(<S@SERVER, {V}@CLIENTS> -> <state=S@SERVER, result=V@SERVER, measurements@SERVER>)`
with `result = (sum_i clip(v_i) + N(0, (clip * noise_multiplier)^2 I)) / clients_per_round`
(the sum factory: without the division).

Noise seed: the fixed-clip mechanism draws its noise with
`SeededGaussianSumQuery` from a seed in the server state. By default that seed
is secret: drawn from the operating system's entropy (`secrets`) when the
factory is built, different in every run, like DP-FTRL's (tensorflow_privacy's
own `GaussianSumQuery` uses an unseeded random op, which TensorFlow's op
determinism, `--deterministic`, refuses). `noise_seed` (simulations only) makes
the seed public, so runs repeat exactly and give no privacy. The adaptive clip
(TFF's `QuantileAdaptiveClipSumQuery`) draws unseeded noise, so it runs only
without op determinism (`--nodeterministic`).
"""

import collections
import secrets
from typing import Optional

import dp_accounting
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp
# Private TFF helper: how the gaussian_adaptive preset splits the noise
# multiplier between the values and the clipped count.
from tensorflow_federated.python.aggregators import differential_privacy as tff_dp

from tff_partial.privacy import dp_ftrl
from tff_partial.privacy import dp_mean


class SeededGaussianSumQuery(tfp.GaussianSumQuery):
  """`tfp.GaussianSumQuery` whose noise follows a public seed (simulations).

  Hand-written (tensorflow_privacy 0.9's query takes no seed): the global state
  carries `seed` (int64[2]); round after round the noise is
  `tf.random.stateless_normal(seed=(seed[0], seed[1] + i))` for the i-th tensor
  and the counter advances past them, as tensorflow_privacy's
  `tree_aggregation.GaussianNoiseGenerator` advances its seeds.
  """

  _GlobalState = collections.namedtuple(  # pylint: disable=invalid-name
      '_GlobalState', ['l2_norm_clip', 'stddev', 'seed'])

  def __init__(self, l2_norm_clip, stddev, noise_seed: int):
    super().__init__(l2_norm_clip, stddev)
    self._noise_seed = int(noise_seed)

  def make_global_state(self, l2_norm_clip, stddev, seed=None):
    if seed is None:
      seed = tf.constant([self._noise_seed, 0], tf.int64)
    return self._GlobalState(tf.cast(l2_norm_clip, tf.float32),
                             tf.cast(stddev, tf.float32), tf.cast(seed, tf.int64))

  def get_noised_result(self, sample_state, global_state):
    flat = tf.nest.flatten(sample_state)
    noised = [
        v + tf.cast(tf.random.stateless_normal(
            tf.shape(v), seed=global_state.seed + tf.constant([0, i], tf.int64),
            stddev=global_state.stddev), v.dtype)
        for i, v in enumerate(flat)]
    new_state = global_state._replace(
        seed=global_state.seed + tf.constant([0, len(flat)], tf.int64))
    return (tf.nest.pack_sequence_as(sample_state, noised), new_state,
            dp_accounting.GaussianDpEvent(global_state.stddev / global_state.l2_norm_clip))


class GaussianSumFactory(dp_mean.DPSumFactory):
  """DP-FedAvg's mechanism as a SUM: clip, sum, add N(0, (z * clip)^2).

  Args:
    noise_multiplier: z, Gaussian noise std / clip norm; >= 0.
    clip_norm: the fixed clip, or the initial clip when `adaptive_clip`; > 0.
    adaptive_clip: adapt the clip to `target_unclipped_quantile` of the update
      norms (TFF's `gaussian_adaptive` query, geometric update).
      `noise_multiplier` is then the total multiplier, part of which TFF
      spends on the noisy clipped count.
    expected_clients: clients per round (the adaptive clip's count noise).
    target_unclipped_quantile: in [0, 1], only with `adaptive_clip`.
    noise_seed: None (default): secret noise (a seed from `secrets`). An
      int: a public seed (no privacy); not with `adaptive_clip`.
  """

  def __init__(self, noise_multiplier: float, clip_norm: float, *,
               adaptive_clip: bool = False, expected_clients: float = 1.0,
               target_unclipped_quantile: float = 0.5,
               noise_seed: Optional[int] = None):
    super().__init__()
    dp_ftrl._check_nonnegative(noise_multiplier, 'noise_multiplier')  # pylint: disable=protected-access
    dp_ftrl._check_positive(clip_norm, 'clip_norm')  # pylint: disable=protected-access
    if adaptive_clip and noise_seed is not None:
      raise ValueError('a public noise seed cannot seed the adaptive clip\'s '
                       'clipped-count noise (TFF\'s query takes no seed)')
    self._z = float(noise_multiplier)
    self._clip = float(clip_norm)
    self._adaptive = adaptive_clip
    self._expected_clients = float(expected_clients)
    self._quantile = float(target_unclipped_quantile)
    self.noise_seed_is_public = noise_seed is not None
    self._noise_seed = noise_seed if noise_seed is not None else secrets.randbits(62)

  def query(self, specs) -> tfp.DPQuery:
    del specs  # the Gaussian queries take any structure
    if self._adaptive:
      # What gaussian_adaptive builds inside its NormalizedQuery.
      value_z, count_stddev = tff_dp.adaptive_clip_noise_params(
          self._z, self._expected_clients)
      return tfp.QuantileAdaptiveClipSumQuery(
          initial_l2_norm_clip=self._clip,
          noise_multiplier=value_z,
          target_unclipped_quantile=self._quantile,
          learning_rate=0.2,
          clipped_count_stddev=count_stddev,
          expected_num_records=self._expected_clients,
          geometric_update=True)
    # gaussian_fixed's query (tfp.GaussianSumQuery inside its NormalizedQuery)
    # with seeded noise.
    return SeededGaussianSumQuery(self._clip, self._clip * self._z, self._noise_seed)


def build_dp_gaussian_factory(
    noise_multiplier: float,
    clients_per_round: int,
    clip_norm: float,
    adaptive_clip: bool = False,
    target_unclipped_quantile: float = 0.5,
    noise_seed: Optional[int] = None,
) -> dp_mean.DPMeanFactory:
  """DP-FedAvg's aggregator: a fixed-denominator mean (`.sum_factory`: the sum).

  Args:
    noise_multiplier: Gaussian noise std / clip norm; >= 0.
    clients_per_round: fixed denominator of the mean; > 0.
    clip_norm: the fixed clip, or the initial clip when `adaptive_clip`; > 0.
    adaptive_clip: adapt the clip to `target_unclipped_quantile` of the update
      norms (TFF's geometric update). `noise_multiplier` is then the total
      effective multiplier, part of which TFF spends on the noisy clipped count.
    target_unclipped_quantile: in [0, 1], only with `adaptive_clip`.
    noise_seed: None: secret noise (default). An int: public, reproducible
      noise for simulations, with no privacy guarantee.
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
  sum_factory = GaussianSumFactory(
      noise_multiplier, clip_norm, adaptive_clip=adaptive_clip,
      expected_clients=float(clients_per_round),
      target_unclipped_quantile=target_unclipped_quantile, noise_seed=noise_seed)
  return dp_mean.DPMeanFactory(sum_factory, denominator=clients_per_round)
