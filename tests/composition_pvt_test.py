"""Composition matrix: PVT (fixed, per_round, per_client_per_round) x aggregators.

See tests/composition_testing.py for the cases and the numpy reference; and
the PVT-specific guarantees: DP at noise 0 is the uniformly weighted masked
mean (the DP sum divided once, by the per-variable trainer counts), and the
masked mean refuses inner factories that are not sums.
"""

# bazel: size=large
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from scripts.methods import pvt
from tests import composition_testing
from tests import testing_utils
from tff_partial import masks
from tff_partial import privacy
from tff_partial.training import loop


class PvtMatrixTest(composition_testing.MatrixTestCase):

  def test_pvt_fixed(self):
    self.check_method('pvt_fixed')

  def test_pvt_per_round(self):
    self.check_method('pvt_per_round')

  def test_pvt_per_client_per_round(self):
    self.check_method('pvt_per_client_per_round')

  def test_dp_gaussian_at_noise_0_is_the_uniform_masked_mean(self):
    task = self.task
    n = len(composition_testing.EXAMPLES)

    def server_update(aggregator):
      ctx = testing_utils.method_context(task, client_lr=composition_testing.CLIENT_LR,
                                         seed=3, aggregator=aggregator)
      built = pvt.build_pvt_method(ctx, scheme='per_client_per_round', freeze_fraction=0.5)
      process = built.process
      weights = loop.initial_model_weights(task, 3)
      state = process.set_model_weights(process.initialize(), weights)
      values = loop.build_client_selection_fn(task, built, n, 3)(1)
      after = process.get_model_weights(process.next(state, values).state)
      return [a - b for a, b in zip(weights.trainable, after.trainable)]

    dp = server_update(privacy.build_dp_gaussian_factory(0.0, n, 1e6))
    # A plain unweighted sum in the masked mean: PVT's mean with uniform weights.
    uniform = server_update(tff.aggregators.SumFactory())
    for d, u in zip(dp, uniform):
      self.assertAllClose(d, u, rtol=1e-6, atol=1e-7)
    self.assertGreater(max(np.abs(u).max() for u in uniform), 1e-3)

  def test_masked_mean_refuses_inner_factories_that_are_not_sums(self):
    for factory in (privacy.build_dp_gaussian_factory(1.0, 3, 0.1),
                    privacy.build_dp_ftrl_factory(1.0, 3, 0.1, population=3),
                    tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(1.0, 3.0, 0.1),
                    tff.aggregators.UnweightedMeanFactory(),
                    privacy.build_median_factory()):
      with self.subTest(type(factory).__name__):
        with self.assertRaisesRegex(ValueError, 'must compute a sum'):
          masks.MaskedMeanFactory(value_sum_factory=factory)
    for factory in (tff.aggregators.SumFactory(),
                    privacy.build_dp_gaussian_factory(1.0, 3, 0.1).sum_factory,
                    privacy.build_dp_ftrl_factory(1.0, 3, 0.1, population=3).sum_factory):
      masks.MaskedMeanFactory(value_sum_factory=factory)  # sums are accepted


if __name__ == '__main__':
  tf.test.main()
