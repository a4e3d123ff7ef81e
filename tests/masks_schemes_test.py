"""PVT mask schemes (tff_partial/masks/schemes.py)."""

import numpy as np
import tensorflow as tf

from tff_partial.masks import schemes
from tff_partial.masks import variable_types as vt

A = vt.ADDITIVE_VECTOR
V = vt.MULTIPLICATIVE_VECTOR
M = vt.MULTIPLICATIVE_MATRIX
# 10 matrices, 4 multiplicative vectors, 6 additive vectors.
TYPES = [M] * 10 + [V] * 4 + [A] * 6


class MaskSamplerTest(tf.test.TestCase):

  def test_reproducible_by_seed(self):
    a = schemes.MaskSampler(TYPES, 'per_client_per_round', 0.5, seed=7)
    b = schemes.MaskSampler(TYPES, 'per_client_per_round', 0.5, seed=7)
    c = schemes.MaskSampler(TYPES, 'per_client_per_round', 0.5, seed=8)
    for r, k in [(0, 0), (3, 1), (100, 9)]:
      np.testing.assert_array_equal(a.mask(r, k), b.mask(r, k))
    # Asking in another order changes nothing (stateless).
    np.testing.assert_array_equal(a.mask(100, 9), b.mask(100, 9))
    self.assertFalse(all(np.array_equal(a.mask(r, 0), c.mask(r, 0)) for r in range(5)))

  def test_counts_and_groups(self):
    sampler = schemes.MaskSampler(TYPES, 'per_client_per_round', 0.9, seed=0)
    self.assertEqual(sampler.num_frozen, 12)  # floor(0.9 * 14)
    for r in range(5):
      for k in range(5):
        mask = sampler.mask(r, k)
        self.assertEqual(mask.dtype, np.float32)
        self.assertEqual(int((mask == 0).sum()), 12)
        np.testing.assert_array_equal(mask[14:], np.ones(6))  # additive: trained

  def test_biases_only_trains_exactly_the_additive_vectors(self):
    sampler = schemes.MaskSampler(TYPES, 'biases_only', seed=3)
    self.assertTrue(sampler.is_static)
    self.assertEqual(sampler.num_frozen, 14)  # every matrix and multiplicative vector
    expected = np.array([0.0] * 14 + [1.0] * 6, np.float32)
    for r, k in [(0, 0), (7, 3)]:
      np.testing.assert_array_equal(sampler.mask(r, k), expected)
    np.testing.assert_array_equal(sampler.trained_probability(), expected)
    sizes = np.arange(1, 21)
    self.assertEqual(schemes.trained_bytes(sampler, sizes), float(sum(range(15, 21))))
    with self.assertRaisesRegex(ValueError, 'biases_only.*no non-freezable'):
      schemes.MaskSampler([M, V], 'biases_only')
    with self.assertRaisesRegex(ValueError, r'\[0, 1\).*--pvt_scheme=biases_only'):
      schemes.MaskSampler(TYPES, 'fixed', 1.0)

  def test_schemes_vary_as_named(self):
    fixed = schemes.MaskSampler(TYPES, 'fixed', 0.5, seed=1)
    per_round = schemes.MaskSampler(TYPES, 'per_round', 0.5, seed=1)
    pcpr = schemes.MaskSampler(TYPES, 'per_client_per_round', 0.5, seed=1)
    for r in range(4):
      for k in range(4):
        np.testing.assert_array_equal(fixed.mask(r, k), fixed.mask(0, 0))
        np.testing.assert_array_equal(per_round.mask(r, k), per_round.mask(r, 0))
    self.assertGreater(len({per_round.mask(r).tobytes() for r in range(10)}), 5)
    self.assertGreater(len({pcpr.mask(0, k).tobytes() for k in range(10)}), 5)
    self.assertGreater(len({pcpr.mask(r, 0).tobytes() for r in range(10)}), 5)

  def test_matrices_first(self):
    sampler = schemes.MaskSampler(TYPES, 'per_client_per_round', 0.5, seed=0,
                                  freeze_matrices_first=True)
    self.assertEqual(sampler.num_frozen, 7)
    for k in range(10):
      mask = sampler.mask(0, k)
      self.assertEqual(int((mask[:10] == 0).sum()), 7)
      np.testing.assert_array_equal(mask[10:], np.ones(10))
    sampler = schemes.MaskSampler(TYPES, 'per_round', 0.9, seed=0,
                                  freeze_matrices_first=True)
    mask = sampler.mask(3)
    np.testing.assert_array_equal(mask[:10], np.zeros(10))
    self.assertEqual(int((mask[10:14] == 0).sum()), 2)

  def test_trained_probability(self):
    sampler = schemes.MaskSampler(TYPES, 'per_client_per_round', 0.5, seed=0)
    prob = sampler.trained_probability()
    np.testing.assert_allclose(prob[:14], np.full(14, 1 - 7 / 14))
    np.testing.assert_allclose(prob[14:], np.ones(6))
    empirical = np.mean([sampler.mask(r, k) for r in range(20) for k in range(20)], 0)
    np.testing.assert_allclose(empirical, prob, atol=0.08)
    sizes = np.arange(1, 21)
    self.assertAlmostEqual(
        schemes.trained_bytes(sampler, sizes), float(np.sum(prob * sizes)))

  def test_zero_fraction_trains_everything(self):
    sampler = schemes.MaskSampler(TYPES, 'per_client_per_round', 0.0, seed=0)
    np.testing.assert_array_equal(sampler.mask(5, 5), np.ones(20))

  def test_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, 'pvt_scheme.*per_client_per_round'):
      schemes.MaskSampler(TYPES, 'random', 0.5)
    with self.assertRaisesRegex(ValueError, 'pvt_freeze_fraction'):
      schemes.MaskSampler(TYPES, 'fixed', 1.0)
    with self.assertRaisesRegex(ValueError, 'pvt_freeze_fraction'):
      schemes.MaskSampler(TYPES, 'fixed', -0.1)


if __name__ == '__main__':
  tf.test.main()
