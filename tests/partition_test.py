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


class DirichletClassSplitTest(tf.test.TestCase):
  """The per-class allocation of Yu et al. 2020 (`dirichlet_class_split`)."""

  def test_every_example_once_and_class_shares_follow_the_dirichlet(self):
    labels = np.repeat(np.arange(3), [40, 30, 30])
    clients = partition.dirichlet_class_split(labels, 4, alpha=0.9, seed=1)
    everything = np.concatenate(clients)
    self.assertAllEqual(np.sort(everything), np.arange(100))  # disjoint, complete
    # By hand: the same generator draws the class orders, then per class the
    # shares; counts are the largest-remainder rounding of share * class size.
    rng = np.random.default_rng(1)
    orders = [rng.permutation(np.flatnonzero(labels == c)) for c in range(3)]
    hist = partition.label_histograms(labels, clients, 3)
    for c, size in enumerate([40, 30, 30]):
      shares = rng.dirichlet(np.full(4, 0.9))
      raw = shares * size
      counts = np.floor(raw).astype(int)
      counts[np.argsort(-(raw - counts), kind='stable')[:size - counts.sum()]] += 1
      self.assertAllEqual(hist[:, c], counts)
      self.assertAllEqual(np.concatenate([clients[k][np.isin(clients[k], orders[c])]
                                          for k in range(4)]), orders[c])

  def test_less_skewed_than_label_split_at_the_same_alpha(self):
    labels = np.repeat(np.arange(10), 500)
    per_class = partition.dirichlet_class_split(labels, 20, 0.9, seed=0, num_classes=10)
    label_skew = partition.dirichlet_label_split(labels, 20, 250, 0.9, seed=0, num_classes=10)
    self.assertGreater(partition.mean_label_entropy(labels, per_class, 10),
                       partition.mean_label_entropy(labels, label_skew, 10) + 0.5)
    self.assertGreater(len({len(c) for c in per_class}), 1)  # sizes differ
    subset = partition.dirichlet_class_split(labels, 20, 0.9, seed=0, num_examples=1000)
    self.assertEqual(sum(len(c) for c in subset), 1000)
    self.assertAllEqual(np.bincount(labels[np.concatenate(subset)]), [100] * 10)
    with self.assertRaisesRegex(ValueError, 'get no example'):
      partition.dirichlet_class_split(np.zeros(3, np.int64), 5, 0.9, seed=0)


if __name__ == '__main__':
  tf.test.main()
