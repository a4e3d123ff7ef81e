"""Tests of the Dirichlet(alpha) label split (tasks/partition.py)."""

import numpy as np
import tensorflow as tf

from tasks import partition


def _labels(per_class=500, num_classes=10):
  return np.repeat(np.arange(num_classes), per_class)


class DirichletLabelSplitTest(tf.test.TestCase):

  def test_exact_sizes_and_disjoint(self):
    labels = _labels()
    clients = partition.dirichlet_label_split(labels, 50, 100, alpha=1.0, seed=3)
    self.assertLen(clients, 50)
    for c in clients:
      self.assertLen(c, 100)
    flat = np.concatenate(clients)
    self.assertLen(np.unique(flat), 5000)  # all examples used exactly once

  def test_reproducible_by_seed(self):
    labels = _labels()
    a = partition.dirichlet_label_split(labels, 20, 50, alpha=0.5, seed=7)
    b = partition.dirichlet_label_split(labels, 20, 50, alpha=0.5, seed=7)
    c = partition.dirichlet_label_split(labels, 20, 50, alpha=0.5, seed=8)
    for x, y in zip(a, b):
      np.testing.assert_array_equal(x, y)
    self.assertFalse(all(np.array_equal(x, y) for x, y in zip(a, c)))

  def test_skew_grows_as_alpha_shrinks(self):
    labels = _labels()
    ent = {
        alpha: partition.mean_label_entropy(
            labels, partition.dirichlet_label_split(labels, 40, 100, alpha, seed=0), 10)
        for alpha in (0.1, 1.0, 100.0)
    }
    self.assertLess(ent[0.1], ent[1.0])
    self.assertLess(ent[1.0], ent[100.0])
    self.assertLess(ent[0.1], 1.0)  # few labels per client
    self.assertGreater(ent[100.0], 2.0)  # near uniform: log(10) = 2.30

  def test_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, 'exceeds'):
      partition.dirichlet_label_split(_labels(10), 11, 10, 1.0, 0)
    with self.assertRaisesRegex(ValueError, 'alpha'):
      partition.dirichlet_label_split(_labels(10), 2, 10, 0.0, 0)


if __name__ == '__main__':
  tf.test.main()
