"""Tests of tff_partial.privacy.dp_ftrl: clipping, noise scale, unbiased tree
sums, restarts, and the FTRL-momentum == SGD-momentum-on-residuals identity."""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_partial.privacy import dp_ftrl

_VALUE_TYPE = tff.types.to_type(collections.OrderedDict(
    a=tff.TensorType(np.float32, [3]), b=tff.TensorType(np.float32, [2])))


def _value(a, b):
  return collections.OrderedDict(a=np.array(a, np.float32), b=np.array(b, np.float32))


def _flat(v):
  return np.concatenate([np.asarray(v['a']).ravel(), np.asarray(v['b']).ravel()])


def _ftrl_momentum(theta0, cumsums, lr, momentum):
  """Reference FTRL with momentum (Kairouz et al. 2021):
  m_t = momentum * m_{t-1} + S_t, theta_t = theta_0 - lr * m_t."""
  m = np.zeros_like(theta0)
  thetas = []
  for s in cumsums:
    m = momentum * m + s
    thetas.append(theta0 - lr * m)
  return thetas


def _run_sgdm_on_residuals(theta0, residuals, lr, momentum):
  """TFF's SGD-momentum server optimizer applied to the aggregator's outputs."""
  opt = dp_ftrl.build_dp_ftrl_server_optimizer(lr, momentum)
  theta = tf.constant(theta0)
  state = opt.initialize(tf.TensorSpec(theta0.shape, tf.float32))
  thetas = []
  for r in residuals:
    state, theta = opt.next(state, theta, tf.constant(r))
    thetas.append(theta.numpy())
  return thetas


class DPFTRLFactoryTest(tf.test.TestCase):

  def test_type_signature(self):
    process = dp_ftrl.DPFTRLFactory(1.0, 3, 1.0, noise_seed=1).create(_VALUE_TYPE)
    self.assertTrue(process.next.type_signature.result.result.member.is_equivalent_to(
        _VALUE_TYPE))
    self.assertTrue(process.next.type_signature.parameter[1].is_equivalent_to(
        tff.FederatedType(_VALUE_TYPE, tff.CLIENTS)))

  def test_clipping_bounds_each_client_contribution(self):
    clip, cpr = 0.5, 3.0
    process = dp_ftrl.DPFTRLFactory(0.0, 3, clip).create(_VALUE_TYPE)
    state = process.initialize()
    # One huge client, others zero: the sum is exactly that client's clipped update.
    big = _value([30., 40., 0.], [0., 120.])  # norm 130
    out = process.next(state, [big, _value([0] * 3, [0] * 2), _value([0] * 3, [0] * 2)])
    contribution = _flat(out.result) * cpr
    self.assertAllClose(np.linalg.norm(contribution), clip, rtol=1e-5)
    self.assertAllClose(contribution, _flat(big) * clip / 130., rtol=1e-5)
    # A small client (norm < clip) passes unchanged; the clip is on the global norm.
    small = _value([0.1, 0., 0.], [0., 0.2])
    out = process.next(out.state, [small, big, big])
    self.assertAllClose(_flat(out.result) * cpr,
                        _flat(small) + 2 * _flat(big) * clip / 130., rtol=1e-5)

  def test_noise_scale_plain_tree_is_popcount_sigma(self):
    # Without Honaker's reweighting the noise on the t-th prefix sum is the sum of
    # popcount(t) independent tree nodes, each N(0, (clip * z)^2).
    dim, clip, z, cpr = 20000, 0.5, 2.0, 1
    vt = tff.TensorType(np.float32, [dim])
    process = dp_ftrl.DPFTRLFactory(z, cpr, clip, noise_seed=7,
                                    use_efficient=False).create(vt)
    state = process.initialize()
    cumsum = np.zeros(dim)
    for t in range(1, 8):
      out = process.next(state, [np.zeros(dim, np.float32)])
      state = out.state
      cumsum += out.result
      expected_var = bin(t).count('1') * (clip * z) ** 2
      # std error of a variance estimate from n samples: var * sqrt(2/n) (~1%).
      self.assertAllClose(np.var(cumsum), expected_var, rtol=0.05, msg=f'round {t}')

  def test_noise_scale_efficient_tree_first_round_and_normalization(self):
    dim, clip, z, cpr = 20000, 0.3, 1.5, 4
    vt = tff.TensorType(np.float32, [dim])
    process = dp_ftrl.DPFTRLFactory(z, cpr, clip, noise_seed=3).create(vt)
    out = process.next(process.initialize(), [np.zeros(dim, np.float32)] * 2)
    # Noise is added to the sum, then divided by clients_per_round.
    self.assertAllClose(np.std(out.result), clip * z / cpr, rtol=0.03)

  def test_noisy_cumulative_sums_are_unbiased(self):
    dim, clip, z, cpr, rounds = 20000, 1.0, 1.0, 2, 6
    vt = tff.TensorType(np.float32, [dim])
    process = dp_ftrl.DPFTRLFactory(z, cpr, clip, noise_seed=11).create(vt)
    rng = np.random.default_rng(0)
    state = process.initialize()
    noisy, true = np.zeros(dim), np.zeros(dim)
    for _ in range(rounds):
      clients = [(rng.normal(size=dim) * 0.2 / np.sqrt(dim)).astype(np.float32)
                 for _ in range(cpr)]
      out = process.next(state, clients)
      state = out.state
      noisy += out.result
      true += sum(clients) / cpr
      err = noisy - true
      # Each coordinate's error is zero-mean with std <= clip*z/cpr: the mean over
      # 20000 coordinates is within 5 standard errors of 0.
      self.assertLess(abs(err.mean()), 5 * clip * z / cpr / np.sqrt(dim))
      self.assertGreater(err.std(), 0.3 * clip * z / cpr)  # noise is really there

  def test_restart_starts_a_fresh_tree(self):
    dim, z = 20000, 1.0
    vt = tff.TensorType(np.float32, [dim])
    zeros = [np.zeros(dim, np.float32)]

    def second_residual_var(restart_period):
      process = dp_ftrl.DPFTRLFactory(z, 1, 1.0, restart_period=restart_period,
                                      noise_seed=5, use_efficient=False).create(vt)
      state = process.next(process.initialize(), zeros).state
      return np.var(process.next(state, zeros).result)

    # No restart: N_2 - N_1 = node[1,2] - leaf1, variance 2 sigma^2.
    self.assertAllClose(second_residual_var(None), 2.0, rtol=0.05)
    # Restart after every round: round 2 is the first leaf of a new tree.
    self.assertAllClose(second_residual_var(1), 1.0, rtol=0.05)

  def test_noise_zero_equals_plain_ftrl_momentum(self):
    clip, cpr, lr, momentum, dim = 1.0, 3, 0.5, 0.9, 4
    vt = tff.TensorType(np.float32, [dim])
    process = dp_ftrl.DPFTRLFactory(0.0, cpr, clip).create(vt)
    rng = np.random.default_rng(1)
    state = process.initialize()
    residuals, means = [], []
    for _ in range(5):
      clients = [rng.normal(size=dim).astype(np.float32) for _ in range(cpr)]
      out = process.next(state, clients)
      state = out.state
      residuals.append(out.result)
      clipped = [c * min(1.0, clip / np.linalg.norm(c)) for c in clients]
      means.append(sum(clipped) / cpr)
    self.assertAllClose(residuals, means, atol=1e-6)
    theta0 = rng.normal(size=dim).astype(np.float32)
    expected = _ftrl_momentum(theta0, np.cumsum(means, axis=0), lr, momentum)
    self.assertAllClose(_run_sgdm_on_residuals(theta0, residuals, lr, momentum),
                        expected, atol=1e-5)

  def test_sgdm_on_residuals_equals_ftrl_momentum_on_noisy_cumsums(self):
    # The identity the server update relies on, with noise.
    cpr, lr, momentum, dim = 2, 0.3, 0.9, 6
    vt = tff.TensorType(np.float32, [dim])
    process = dp_ftrl.DPFTRLFactory(1.0, cpr, 1.0, noise_seed=2).create(vt)
    rng = np.random.default_rng(2)
    state = process.initialize()
    residuals = []
    for _ in range(7):
      out = process.next(state, [rng.normal(size=dim).astype(np.float32)] * cpr)
      state = out.state
      residuals.append(out.result)
    theta0 = np.zeros(dim, np.float32)
    noisy_cumsums = np.cumsum(residuals, axis=0)
    self.assertAllClose(_run_sgdm_on_residuals(theta0, residuals, lr, momentum),
                        _ftrl_momentum(theta0, noisy_cumsums, lr, momentum), atol=1e-4)

  def test_bad_input(self):
    with self.assertRaisesRegex(ValueError, 'noise_multiplier'):
      dp_ftrl.DPFTRLFactory(-1.0, 3, 1.0)
    with self.assertRaisesRegex(ValueError, 'clip_norm'):
      dp_ftrl.DPFTRLFactory(1.0, 3, 0.0)
    with self.assertRaisesRegex(ValueError, 'clip_norm'):
      dp_ftrl.DPFTRLFactory(1.0, 3, -0.1)
    with self.assertRaisesRegex(ValueError, 'clients_per_round'):
      dp_ftrl.DPFTRLFactory(1.0, 0, 1.0)
    with self.assertRaisesRegex(ValueError, 'restart_period'):
      dp_ftrl.DPFTRLFactory(1.0, 3, 1.0, restart_period=0)
    with self.assertRaisesRegex(ValueError, 'population'):
      dp_ftrl.build_dp_ftrl_factory(1.0, 3, 1.0, population=None)
    with self.assertRaisesRegex(ValueError, 'clients_per_round'):
      dp_ftrl.build_dp_ftrl_factory(1.0, 30, 1.0, population=10)
    with self.assertRaisesRegex(ValueError, 'server_momentum'):
      dp_ftrl.build_dp_ftrl_server_optimizer(1.0, momentum=1.5)
    with self.assertRaisesRegex(ValueError, 'floating'):
      dp_ftrl.DPFTRLFactory(1.0, 3, 1.0).create(tff.TensorType(np.int32, [2]))

  def test_restart_period_is_one_epoch(self):
    factory = dp_ftrl.build_dp_ftrl_factory(1.0, 10, 0.3, population=105)
    self.assertEqual(factory.restart_period, 10)
    self.assertIsNone(dp_ftrl.build_dp_ftrl_factory(
        1.0, 10, 0.3, population=105, restart=False).restart_period)


if __name__ == '__main__':
  tf.test.main()
