"""Tests of tff_partial.adaptation.evaluation: class-ratio accuracy by hand."""

import types

import numpy as np
import tensorflow as tf

from tff_partial.adaptation import evaluation
from tff_partial.adaptation import strategies


def _identity_model():
  """Logits = the input itself: the prediction is the argmax of x (3 classes)."""
  return tf.keras.Sequential([
      tf.keras.layers.Input((3,)),
      tf.keras.layers.Dense(3, use_bias=False, kernel_initializer='identity', name='top'),
  ])


def _task():
  # Just what ParticipantEvaluator reads of a `tasks.registry.Task`.
  return types.SimpleNamespace(
      name='hand', keras_model_fn=_identity_model,
      loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics_fn=lambda: [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')])


class ClassRatioAccuracyTest(tf.test.TestCase):

  def test_hand_made_example(self):
    # Global test set: class 0 has 4 examples (2 right), class 1 has 2 (both
    # right), class 2 has 4 (1 right).
    labels = np.array([0, 0, 0, 0, 1, 1, 2, 2, 2, 2])
    predicted = np.array([0, 0, 1, 2, 1, 1, 2, 0, 0, 1])
    per_class = evaluation.per_class_accuracy(predicted, labels, 3)
    self.assertAllClose(per_class, [0.5, 1.0, 0.25])
    # A participant holding 6 of class 0, 2 of class 1, none of class 2:
    # 0.75 * 0.5 + 0.25 * 1.0 + 0 * 0.25 = 0.625 (plain accuracy: 5/10 = 0.5).
    ratios = evaluation.class_ratios(np.array([0, 1, 0, 0, 0, 1, 0, 0]), 3)
    self.assertAllClose(ratios, [0.75, 0.25, 0.0])
    self.assertAlmostEqual(evaluation.class_ratio_accuracy(per_class, ratios), 0.625)
    # Uniform ratios give the mean per-class accuracy, not the plain accuracy.
    self.assertAlmostEqual(
        evaluation.class_ratio_accuracy(per_class, np.full(3, 1 / 3)), 1.75 / 3)
    # A class the participant has but the test set lacks cannot be judged.
    with self.assertRaisesRegex(ValueError, r'classes \[2\]'):
      evaluation.class_ratio_accuracy([0.5, 1.0, np.nan], [0.5, 0.0, 0.5])
    self.assertAlmostEqual(
        evaluation.class_ratio_accuracy([0.5, 1.0, np.nan], [0.5, 0.5, 0.0]), 0.75)

  def test_evaluator_scores_a_known_model(self):
    # The same hand-made test set, as inputs whose argmax is `predicted`.
    labels = np.array([0, 0, 0, 0, 1, 1, 2, 2, 2, 2])
    predicted = np.array([0, 0, 1, 2, 1, 1, 2, 0, 0, 1])
    x = np.eye(3, dtype=np.float32)[predicted]
    config = strategies.TrainConfig(epochs=0, learning_rate=0.1, batch_size=4)
    evaluator = evaluation.ParticipantEvaluator(
        _task(), [np.eye(3, dtype=np.float32)], local_config=config,
        adapt_config=config, strategy_names=['finetune'],
        metric=evaluation.CLASS_RATIO_ACCURACY, global_test=(x, labels))
    train_y = np.array([0, 1, 0, 0, 0, 1, 0, 0])
    data = evaluation.ParticipantData(
        'p', np.eye(3, dtype=np.float32)[train_y], train_y, None, None,
        evaluation.GLOBAL_TEST)
    row = evaluator.evaluate(data)
    self.assertEqual((row['split'], row['num_train'], row['num_test']), ('global_test', 8, 10))
    self.assertAlmostEqual(row['federated'], 0.625)
    # Zero epochs leave the models as they start: the federated weights, and
    # for the local model the identity initializer (the same model).
    self.assertAlmostEqual(row['finetune'], 0.625)
    self.assertAlmostEqual(row['local'], 0.625)
    # Plain accuracy on held-out data instead: 5 of these 10 are right.
    plain = evaluation.ParticipantEvaluator(
        _task(), [np.eye(3, dtype=np.float32)], local_config=config,
        adapt_config=config, strategy_names=['finetune'])
    held_out = evaluation.ParticipantData('p', data.train_x, train_y, x, labels, 'in_order')
    self.assertAlmostEqual(plain.evaluate(held_out)['federated'], 0.5)
    with self.assertRaisesRegex(ValueError, 'do not fit metric'):
      plain.evaluate(data)
    with self.assertRaisesRegex(ValueError, 'global_test'):
      evaluation.ParticipantEvaluator(
          _task(), [np.eye(3, dtype=np.float32)], local_config=config,
          adapt_config=config, metric=evaluation.CLASS_RATIO_ACCURACY)

  def test_global_test_data_keeps_the_first_per_class(self):
    x = np.arange(8, dtype=np.float32).reshape(8, 1)
    y = np.array([1, 0, 1, 1, 0, 2, 1, 0])
    task = types.SimpleNamespace(
        name='t', centralized_test_dataset=lambda: tf.data.Dataset.from_tensor_slices(
            (x, y)).batch(3))
    gx, gy = evaluation.global_test_data(task, max_per_class=2)
    self.assertAllEqual(gy, [1, 0, 1, 0, 2])
    self.assertAllEqual(gx.reshape(-1), [0, 1, 2, 4, 5])
    self.assertAllEqual(evaluation.global_test_data(task)[1], y)


if __name__ == '__main__':
  tf.test.main()
