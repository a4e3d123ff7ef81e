"""Tests of tff_partial.privacy.dp_fedavg: clipping, Gaussian noise scale, adaptive clip."""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_partial.privacy import dp_fedavg


class DPGaussianTest(tf.test.TestCase):

  def test_clipping_bounds_each_client_contribution(self):
    clip, cpr = 0.3, 2
    vt = tff.types.to_type([tff.TensorType(np.float32, [2]), tff.TensorType(np.float32, [1])])
    process = dp_fedavg.build_dp_gaussian_factory(0.0, cpr, clip).create(vt)
    big = [np.array([3., 4.], np.float32), np.array([12.], np.float32)]  # norm 13
    zero = [np.zeros(2, np.float32), np.zeros(1, np.float32)]
    out = process.next(process.initialize(), [big, zero])
    contribution = np.concatenate([np.asarray(x) for x in out.result]) * cpr
    self.assertAllClose(np.linalg.norm(contribution), clip, rtol=1e-5)
    self.assertAllClose(contribution, np.array([3., 4., 12.]) * clip / 13., rtol=1e-5)

  def test_noise_scale(self):
    # GaussianSumQuery adds N(0, (clip*z)^2) to the sum; the mean divides by cpr.
    dim, clip, z, cpr = 40000, 0.5, 2.0, 4
    vt = tff.TensorType(np.float32, [dim])
    tf.random.set_seed(0)
    process = dp_fedavg.build_dp_gaussian_factory(z, cpr, clip).create(vt)
    out = process.next(process.initialize(), [np.zeros(dim, np.float32)] * cpr)
    expected_std = clip * z / cpr
    # std error of the sample std is std/sqrt(2n) ~ 0.35%: 3% is > 8 SE.
    self.assertAllClose(np.std(out.result), expected_std, rtol=0.03)
    self.assertLess(abs(np.mean(out.result)), 5 * expected_std / np.sqrt(dim))

  def test_adaptive_clip_moves_the_clip_towards_the_median_norm(self):
    vt = tff.TensorType(np.float32, [2])
    process = dp_fedavg.build_dp_gaussian_factory(
        0.0, 3, 0.1, adaptive_clip=True).create(vt)
    state = process.initialize()
    clients = [np.array([3., 4.], np.float32)] * 3  # norm 5 >> initial clip 0.1
    clips = []
    for _ in range(3):
      out = process.next(state, clients)
      state = out.state
      clips.append(float(out.measurements['dp_query_metrics']['clip']))
    self.assertGreater(clips[0], 0.1)
    self.assertGreater(clips[2], clips[1])

  def test_bad_input(self):
    with self.assertRaisesRegex(ValueError, 'noise_multiplier'):
      dp_fedavg.build_dp_gaussian_factory(-0.5, 3, 1.0)
    with self.assertRaisesRegex(ValueError, 'clip_norm'):
      dp_fedavg.build_dp_gaussian_factory(1.0, 3, 0.0)
    with self.assertRaisesRegex(ValueError, 'clients_per_round'):
      dp_fedavg.build_dp_gaussian_factory(1.0, 0, 1.0)
    with self.assertRaisesRegex(ValueError, 'target_unclipped_quantile'):
      dp_fedavg.build_dp_gaussian_factory(1.0, 3, 1.0, adaptive_clip=True,
                                          target_unclipped_quantile=1.5)


if __name__ == '__main__':
  tf.test.main()
