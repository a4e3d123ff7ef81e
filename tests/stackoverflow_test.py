"""Tests of the Stack Overflow tasks (tasks/stackoverflow.py) on TFF's synthetic data."""

import tempfile

import numpy as np
import tensorflow as tf

from tasks import registry
from tasks import stackoverflow
from tests import task_testing
from tests import testing_utils


def _synthetic(name, **hparams):
  return registry.create_task(
      name, train_client_spec=testing_utils.client_spec(batch_size=4),
      data_source='synthetic', **hparams)


class TransformerTest(tf.test.TestCase):

  def test_param_count_and_names(self):
    untied = stackoverflow.create_transformer(vocab_size=10000, tie_embeddings=False)
    # By hand (dim 96, 8 heads x 12, FFN 2048, 10,004 tokens, length 20):
    #   embedding 10004*96 = 960,384; positions 20*96 = 1,920
    #   per block: attention 4*(96*96+96) = 37,248; norms 2*192 = 384;
    #              ffn1 96*2048+2048 = 198,656; ffn2 2048*96+96 = 196,704
    #              = 432,992, x 3 = 1,298,976
    #   output 96*10004+10004 = 970,388                 total 3,231,668
    self.assertEqual(task_testing.param_count(untied), 3_231_668)
    names = [l.name for l in untied.layers]
    for i in (1, 2, 3):
      for part in ('attention', 'norm1', 'ffn1', 'ffn2', 'norm2'):
        self.assertIn(f'encoder{i}_{part}', names)
    self.assertEqual(names[1:3], ['embedding', 'position_embedding'])
    self.assertEqual(names[-1], 'output')
    # Tied (the default): the output reuses the embedding matrix and keeps its
    # bias of 10,004: 3,231,668 - 96*10,004 = 2,271,284, one layer `embedding`.
    tied = stackoverflow.create_transformer(vocab_size=10000)
    self.assertEqual(task_testing.param_count(tied), 2_271_284)
    self.assertNotIn('output', [l.name for l in tied.layers])
    self.assertEqual([tuple(w.shape) for w in tied.get_layer('embedding').weights],
                     [(10004, 96), (10004,)])

  def test_tied_logits_use_the_embedding_matrix(self):
    model = stackoverflow.create_transformer(10, sequence_length=3, num_layers=1,
                                             embed_dim=4, num_heads=2, ffn_dim=8)
    layer = model.get_layer('embedding')
    layer.output_bias.assign(tf.range(14, dtype=tf.float32))
    h = tf.random.stateless_normal([2, 3, 4], seed=[1, 2])
    self.assertAllClose(layer(h, logits=True),
                        tf.matmul(h, layer.embeddings, transpose_b=True)
                        + tf.range(14, dtype=tf.float32))
    self.assertEqual(model(np.ones([2, 3], np.int64)).shape, (2, 3, 14))
    # Keras' clone keeps the tie (one layer called twice), as federated select needs.
    clone = tf.keras.models.clone_model(model)
    self.assertEqual(task_testing.param_count(clone), task_testing.param_count(model))

  def test_causal(self):
    # Changing a later word must not change earlier predictions.
    model = stackoverflow.create_transformer(20, sequence_length=6, num_layers=1,
                                             embed_dim=8, num_heads=2, ffn_dim=16)
    a = np.array([[1, 2, 3, 4, 5, 6]], np.int64)
    b = a.copy()
    b[0, 4] = 9
    pa, pb = model(a, training=False), model(b, training=False)
    self.assertAllClose(pa[:, :4], pb[:, :4])
    self.assertNotAllClose(pa[:, 4:], pb[:, 4:])


class NwpTaskTest(tf.test.TestCase):

  def test_synthetic_builds_and_runs_one_round(self):
    task = _synthetic('stackoverflow_nwp', vocab_size=100, num_layers=1, embed_dim=16,
                      num_heads=2, ffn_dim=32, max_sentences_per_client=2)
    self.assertEqual(task.data_source, 'synthetic')
    self.assertIn('SYNTHETIC', task.data_description)
    self.assertEqual(task.population, 3)
    cid = task.train_data.client_ids[0]
    batches = list(task.baseline.datasets.train_preprocess_fn(
        task.train_data.create_tf_dataset_for_client(cid)))
    self.assertEqual(sum(int(x.shape[0]) for x, _ in batches), 2)  # at most 2 sentences
    self.assertEqual(batches[0][0].shape[1], 20)
    _, _, history = task_testing.run_fedavg(task, num_rounds=1, clients_per_round=2)
    self.assertEqual(history[0]['num_examples'], 4)

  def test_auto_without_database_is_a_clear_error(self):
    with self.assertRaisesRegex(registry.TaskError, 'stackoverflow.sqlite.*--data_source=synthetic --clients_per_round=3 '):
      registry.create_task('stackoverflow_nwp', train_client_spec=testing_utils.client_spec(),
                           cache_dir=tempfile.mkdtemp())

  def test_accuracy_masks_pad_oov_eos(self):
    task = _synthetic('stackoverflow_nwp', vocab_size=10, num_layers=1, embed_dim=8,
                      num_heads=2, ffn_dim=8)
    (accuracy,) = task.metrics_fn()
    # vocab 10: pad 0, words 1..10, OOV 11, BOS 12, EOS 13.
    y_true = tf.constant([[3, 11, 13, 0]])
    y_pred = tf.one_hot([[3, 11, 13, 0]], 14)  # right everywhere
    y_pred_wrong = tf.one_hot([[4, 11, 13, 0]], 14)  # wrong on the only real word
    accuracy.update_state(y_true, y_pred)
    self.assertAllClose(accuracy.result(), 1.0)
    accuracy.reset_state()
    accuracy.update_state(y_true, y_pred_wrong)
    self.assertAllClose(accuracy.result(), 0.0)


class TagsTaskTest(tf.test.TestCase):

  def test_synthetic_builds_and_runs_one_round(self):
    task = _synthetic('stackoverflow_tags', vocab_size=50, num_tags=20)
    model = task.keras_model_fn()
    self.assertEqual([l.name for l in model.layers], ['dense'])
    self.assertEqual(task_testing.param_count(model), 50 * 20 + 20)
    self.assertEqual(task_testing.param_count(
        stackoverflow.create_logistic_regression(10000, 500)), 5_000_500)
    x, y = next(iter(task.baseline.datasets.train_preprocess_fn(
        task.train_data.create_tf_dataset_for_client(task.train_data.client_ids[0]))))
    self.assertEqual(x.shape[1], 50)
    self.assertEqual(y.shape[1], 20)
    sums = tf.reduce_sum(x, axis=1).numpy()  # normalized bag (0: only OOV words)
    self.assertTrue(np.all(np.isclose(sums, 1.0) | (sums == 0)), sums)
    self.assertGreater(sums.max(), 0.99)
    self.assertEqual([m.name for m in task.metrics_fn()], ['precision', 'recall_at_5'])
    _, _, history = task_testing.run_fedavg(task, num_rounds=1, clients_per_round=3,
                                            client_lr=0.01)
    self.assertGreater(history[0]['num_examples'], 0)


if __name__ == '__main__':
  tf.test.main()
