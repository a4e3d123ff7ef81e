"""Tests of tff_partial.privacy.sampling: each client at most once per epoch."""

from absl.testing import absltest
import numpy as np

from tff_partial.privacy import sampling


class EpochSamplerTest(absltest.TestCase):

  def test_no_client_twice_within_an_epoch_and_reproducible(self):
    sample = sampling.build_epoch_sampler(population=23, clients_per_round=5, seed=3)
    per_epoch = 23 // 5
    for epoch in range(3):
      rounds = range(epoch * per_epoch + 1, (epoch + 1) * per_epoch + 1)
      chosen = np.concatenate([sample(r) for r in rounds])
      self.assertLen(chosen, 5 * per_epoch)
      self.assertLen(set(chosen.tolist()), len(chosen))
      self.assertTrue(np.all((chosen >= 0) & (chosen < 23)))
    again = sampling.build_epoch_sampler(population=23, clients_per_round=5, seed=3)
    np.testing.assert_array_equal(sample(7), again(7))
    other = sampling.build_epoch_sampler(population=23, clients_per_round=5, seed=4)
    self.assertFalse(np.array_equal(sample(1), other(1)))
    # Epochs differ (fresh permutation per epoch).
    self.assertFalse(np.array_equal(sample(1), sample(1 + per_epoch)))

  def test_bad_input(self):
    with self.assertRaisesRegex(ValueError, 'clients_per_round'):
      sampling.build_epoch_sampler(population=3, clients_per_round=5, seed=0)
    with self.assertRaisesRegex(ValueError, 'round_num'):
      sampling.build_epoch_sampler(population=30, clients_per_round=5, seed=0)(0)


if __name__ == '__main__':
  absltest.main()
