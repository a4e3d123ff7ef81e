"""Tests of tff_partial.adaptation.strategies and .fisher on a tiny model."""

import numpy as np
import tensorflow as tf

from tff_partial.adaptation import fisher
from tff_partial.adaptation import strategies


def _model_fn():
  return tf.keras.Sequential([
      tf.keras.layers.Input((5,)),
      tf.keras.layers.Dense(4, activation='tanh', name='hidden'),
      tf.keras.layers.Dense(3, name='top'),
  ])


def _loss_fn():
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _data(n=30):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(n, 5)).astype(np.float32)
  y = rng.integers(0, 3, n).astype(np.int32)
  return x, y


_CONFIG = strategies.TrainConfig(epochs=5, learning_rate=0.1, batch_size=8)


class StrategiesTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    tf.keras.utils.set_random_seed(1)
    self.w0 = _model_fn().get_weights()  # [hidden kernel, bias, top kernel, bias]
    self.x, self.y = _data()

  def _max_change(self, weights):
    return max(np.abs(a - b).max() for a, b in zip(weights, self.w0))

  def test_finetune_changes_every_variable(self):
    trainer = strategies.LocalTrainer(_model_fn, _loss_fn)
    tuned = trainer.train('finetune', self.w0, self.x, self.y, _CONFIG, seed=0)
    for before, after in zip(self.w0, tuned):
      self.assertGreater(np.abs(after - before).max(), 1e-4)

  def test_freeze_base_trains_only_top_layer(self):
    trainer = strategies.LocalTrainer(_model_fn, _loss_fn)
    self.assertEqual(strategies.top_layer(trainer.model).name, 'top')
    tuned = trainer.train('freeze_base', self.w0, self.x, self.y, _CONFIG, seed=0)
    self.assertAllEqual(tuned[0], self.w0[0])  # hidden kernel untouched
    self.assertAllEqual(tuned[1], self.w0[1])  # hidden bias untouched
    self.assertGreater(np.abs(tuned[2] - self.w0[2]).max(), 1e-3)
    self.assertGreater(np.abs(tuned[3] - self.w0[3]).max(), 1e-3)

  def test_training_lowers_the_loss(self):
    trainer = strategies.LocalTrainer(_model_fn, _loss_fn)
    loss = _loss_fn()
    trainer.model.set_weights(self.w0)
    before = float(loss(self.y, trainer.model(self.x)))
    config = strategies.TrainConfig(epochs=30, learning_rate=0.3, batch_size=8)
    trainer.train('finetune', self.w0, self.x, self.y, config, seed=0)
    after = float(loss(self.y, trainer.model(self.x)))
    self.assertLess(after, before - 0.1)

  def test_ewc_with_huge_lambda_stays_at_federated_weights(self):
    trainer = strategies.LocalTrainer(
        _model_fn, _loss_fn, strategies.StrategyConfig(ewc_lambda=1e6))
    trainer.model.set_weights(self.w0)
    fim = fisher.empirical_fisher(trainer.model, _loss_fn(), self.x, self.y)
    self.assertGreater(min(f.min() for f in fim), 0.0)
    tuned = trainer.train('finetune', self.w0, self.x, self.y, _CONFIG, seed=0)
    ewc = trainer.train('ewc', self.w0, self.x, self.y, _CONFIG, seed=0, fisher=fim)
    self.assertGreater(self._max_change(tuned), 0.1)
    self.assertLess(self._max_change(ewc), 1e-4)

  def test_ewc_with_zero_lambda_equals_finetune(self):
    trainer = strategies.LocalTrainer(
        _model_fn, _loss_fn, strategies.StrategyConfig(ewc_lambda=0.0))
    fim = [np.ones_like(w) for w in self.w0]
    tuned = trainer.train('finetune', self.w0, self.x, self.y, _CONFIG, seed=0)
    ewc = trainer.train('ewc', self.w0, self.x, self.y, _CONFIG, seed=0, fisher=fim)
    for a, b in zip(tuned, ewc):
      self.assertAllEqual(a, b)

  def test_ewc_moderate_lambda_is_in_between(self):
    trainer = strategies.LocalTrainer(
        _model_fn, _loss_fn, strategies.StrategyConfig(ewc_lambda=100.0))
    trainer.model.set_weights(self.w0)
    fim = fisher.empirical_fisher(trainer.model, _loss_fn(), self.x, self.y)
    tuned = trainer.train('finetune', self.w0, self.x, self.y, _CONFIG, seed=0)
    ewc = trainer.train('ewc', self.w0, self.x, self.y, _CONFIG, seed=0, fisher=fim)
    self.assertBetween(self._max_change(ewc), 1e-3, 0.5 * self._max_change(tuned))

  def test_distill_with_alpha_zero_equals_finetune_exactly(self):
    trainer = strategies.LocalTrainer(
        _model_fn, _loss_fn, strategies.StrategyConfig(kd_alpha=0.0))
    tuned = trainer.train('finetune', self.w0, self.x, self.y, _CONFIG, seed=3)
    kd = trainer.train('distill', self.w0, self.x, self.y, _CONFIG, seed=3)
    for a, b in zip(tuned, kd):
      self.assertAllEqual(a, b)
    # And a different batch order gives different weights (the test can fail).
    other = trainer.train('finetune', self.w0, self.x, self.y, _CONFIG, seed=4)
    self.assertNotAllClose(tuned[0], other[0])

  def test_distill_with_alpha_one_differs_from_finetune(self):
    trainer = strategies.LocalTrainer(
        _model_fn, _loss_fn, strategies.StrategyConfig(kd_alpha=1.0))
    tuned = trainer.train('finetune', self.w0, self.x, self.y, _CONFIG, seed=0)
    kd = trainer.train('distill', self.w0, self.x, self.y, _CONFIG, seed=0)
    self.assertNotAllClose(tuned[2], kd[2])
    # The teacher is the start: alpha=1 has zero gradient at the start, so KD
    # stays much closer to the federated weights.
    self.assertLess(self._max_change(kd), 0.1 * self._max_change(tuned))

  def test_distillation_loss_values(self):
    loss = _loss_fn()
    logits = tf.constant([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]])
    labels = tf.constant([1, 2])
    self.assertAllClose(
        strategies.distillation_loss(logits, logits, labels, loss, 1.0, 6.0), 0.0)
    self.assertAllClose(
        strategies.distillation_loss(logits, logits, labels, loss, 0.0, 6.0),
        loss(labels, logits))
    teacher = tf.constant([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    t = 2.0
    p = np.full(3, 1 / 3)
    q = tf.nn.softmax(logits / t).numpy()
    kl = np.mean(np.sum(p * (np.log(p) - np.log(q)), axis=-1))
    self.assertAllClose(
        strategies.distillation_loss(teacher, logits, labels, loss, 0.5, t),
        0.5 * t**2 * kl + 0.5 * float(loss(labels, logits)), atol=1e-6)

  def test_local_start_is_seeded(self):
    trainer = strategies.LocalTrainer(_model_fn, _loss_fn)
    a, b = trainer.fresh_weights(5), trainer.fresh_weights(5)
    c = trainer.fresh_weights(6)
    self.assertAllEqual(a[0], b[0])
    self.assertNotAllClose(a[0], c[0])

  def test_bad_config_raises(self):
    with self.assertRaisesRegex(ValueError, 'learning_rate'):
      strategies.TrainConfig(learning_rate=0.0).validate()
    with self.assertRaisesRegex(ValueError, 'kd_alpha'):
      strategies.LocalTrainer(_model_fn, _loss_fn,
                              strategies.StrategyConfig(kd_alpha=2.0))
    trainer = strategies.LocalTrainer(_model_fn, _loss_fn)
    with self.assertRaisesRegex(ValueError, 'unknown strategy'):
      trainer.train('nope', self.w0, self.x, self.y, _CONFIG, seed=0)


class FisherTest(tf.test.TestCase):

  def test_per_example_fisher_of_softmax_regression(self):
    # For logits = x W + b, d(-log p_y)/db = softmax(logits) - onehot(y).
    model = tf.keras.Sequential([tf.keras.layers.Input((5,)),
                                 tf.keras.layers.Dense(3, name='top')])
    x, y = _data(12)
    fim = fisher.empirical_fisher(model, _loss_fn(), x, y)
    probs = tf.nn.softmax(model(x)).numpy()
    residual = probs - np.eye(3)[y]
    self.assertAllClose(fim[1], np.mean(residual**2, axis=0), rtol=1e-5)
    expected_kernel = np.mean(
        (x[:, :, None] * residual[:, None, :])**2, axis=0)
    self.assertAllClose(fim[0], expected_kernel, rtol=1e-5)
    # Per-batch Fisher squares the batch mean gradient instead.
    batch = fisher.empirical_fisher(model, _loss_fn(), x, y, batch_size=12)
    self.assertAllClose(batch[1], np.mean(residual, axis=0)**2, rtol=1e-5)
    # max_examples uses the first examples only.
    first = fisher.empirical_fisher(model, _loss_fn(), x, y, max_examples=4)
    self.assertAllClose(first[1], np.mean(residual[:4]**2, axis=0), rtol=1e-5)


if __name__ == '__main__':
  tf.test.main()
