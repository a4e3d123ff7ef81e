"""Smoke tests of scripts.adapt on synthetic EMNIST (a fake run directory)."""

import csv
import io
import json
import os
import shutil
import tempfile
from unittest import mock

from absl import flags
from absl.testing import flagsaver
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from scripts import adapt
from scripts import flag_groups
from scripts import runtime_flags
from tasks import cifar10
from tasks import emnist
from tests import testing_utils
from tff_partial.adaptation import evaluation
from tff_partial.runtime import local

FLAGS = flags.FLAGS


def _write_run(run_dir: str, task: str = 'emnist_cnn') -> None:
  """A fake scripts.train run: seeded initial weights + flags.json."""
  os.makedirs(run_dir, exist_ok=True)
  tf.keras.utils.set_random_seed(0)
  weights = emnist.create_cnn().get_weights()
  np.savez(os.path.join(run_dir, 'model_weights.npz'), *weights)
  with open(os.path.join(run_dir, 'flags.json'), 'w') as f:
    json.dump({'task': task, 'data_source': 'synthetic', 'data_dir': None,
               'algorithm': 'fedavg', 'aggregator': 'mean'}, f)


class AdaptMainTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    if not FLAGS.is_parsed():
      FLAGS.mark_as_parsed()
    self.dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
    self.run_dir = os.path.join(self.dir, 'run')
    _write_run(self.run_dir)

  def test_main_on_two_synthetic_participants(self):
    out = os.path.join(self.dir, 'out')
    with flagsaver.flagsaver(
        run_dir=self.run_dir, results_dir=out, num_participants=2,
        local_epochs=1, adapt_epochs=1, adapt_batch_size=4,
        fisher_max_examples=3, seed=1):
      adapt.main(['adapt'])
      # The run's flags.json chose the task and the data.
      self.assertEqual(FLAGS.data_source, 'synthetic')
    with open(os.path.join(out, 'participants.csv')) as f:
      rows = list(csv.DictReader(f))
    self.assertEqual([r['participant'] for r in rows], ['synthetic1', 'synthetic2'])
    self.assertEqual(
        list(rows[0]), ['participant', 'split', 'num_train', 'num_test',
                        'federated', 'local', 'finetune', 'freeze_base', 'ewc',
                        'distill'])
    for r in rows:
      # Synthetic EMNIST has no separate test data: 10 examples split in order.
      self.assertEqual((r['split'], r['num_train'], r['num_test']), ('in_order', '8', '2'))
      for column in ('federated', 'local', 'finetune', 'freeze_base', 'ewc', 'distill'):
        self.assertBetween(float(r[column]), 0.0, 1.0)
    with open(os.path.join(out, 'summary.json')) as f:
      result = json.load(f)
    self.assertEqual(result['num_participants'], 2)
    self.assertEqual(result['run']['task'], 'emnist_cnn')
    self.assertEqual(result['config']['adapt_epochs'], 1)
    self.assertEqual(set(result['best_strategy_counts']),
                     {'finetune', 'freeze_base', 'ewc', 'distill'})
    self.assertEqual(sum(result['best_strategy_counts'].values()), 2)

    # A second run reuses the local accuracies instead of retraining them.
    again = os.path.join(self.dir, 'again')
    with flagsaver.flagsaver(
        run_dir=self.run_dir, results_dir=again, num_participants=2,
        local_epochs=1, adapt_epochs=1, adapt_batch_size=4, seed=1,
        strategies=['freeze_base'],
        reuse_local_from=os.path.join(out, 'participants.csv')):
      adapt.main(['adapt'])
    with open(os.path.join(again, 'participants.csv')) as f:
      rows_again = list(csv.DictReader(f))
    self.assertEqual([r['local'] for r in rows_again], [r['local'] for r in rows])
    self.assertEqual([r['federated'] for r in rows_again], [r['federated'] for r in rows])
    with flagsaver.flagsaver(
        run_dir=self.run_dir, results_dir=again, num_participants=2,
        local_epochs=2, seed=1,
        reuse_local_from=os.path.join(out, 'participants.csv')):
      with self.assertRaisesRegex(ValueError, 'local_epochs=1'):
        adapt.run(again)


  def test_train_if_missing_trains_then_adapts(self):
    run_dir = os.path.join(self.dir, 'trained')
    out = os.path.join(self.dir, 'trained_out')
    training = dict(task='emnist_2nn', data_source='synthetic', total_rounds=1,
                    clients_per_round=2, rounds_per_checkpoint=1, client_batch_size=5)
    with flagsaver.flagsaver(
        run_dir=run_dir, results_dir=out, train_if_missing=True,
        local_epochs=1, adapt_epochs=1, strategies=['finetune'], **training):
      with mock.patch.object(runtime_flags, 'configure_from_flags',
                             wraps=runtime_flags.configure_from_flags) as configure:
        adapt.main(['adapt'])
    # It trained on the runtime scripts.train sets up (the local worker this
    # package starts, its clients at once and threads), not TFF's default.
    configure.assert_called_once_with()
    self.assertIsInstance(tff.framework.get_context_stack().current, local.LocalContext)
    with open(os.path.join(run_dir, 'flags.json')) as f:
      saved = json.load(f)
    self.assertEqual((saved['task'], saved['algorithm']), ('emnist_2nn', 'fedavg'))
    self.assertNotIn('local_epochs', saved)  # adapt's own flags are not the run's
    self.assertTrue(os.path.exists(os.path.join(run_dir, 'model_weights.npz')))
    with open(os.path.join(out, 'summary.json')) as f:
      self.assertEqual(json.load(f)['num_participants'], 2)
    # The model scripts.train trains with the same flags, to the last bit.
    code, _, err = testing_utils.run_train_main(
        root_output_dir=self.dir, experiment_name='by_train', **training)
    self.assertEqual(code, 0, err)
    by_adapt = testing_utils.load_npz_weights(os.path.join(run_dir, 'model_weights.npz'))
    by_train = testing_utils.load_npz_weights(
        os.path.join(self.dir, 'by_train', 'model_weights.npz'))
    self.assertLen(by_adapt, len(by_train))
    for a, t in zip(by_adapt, by_train):
      np.testing.assert_array_equal(a, t)

  def test_train_if_missing_checks_its_flags_before_the_data_loads(self):
    # The data directory does not exist: an error about it would mean the
    # data was read before the training and layer flags were checked.
    missing = os.path.join(self.dir, 'no_data')
    common = dict(run_dir=os.path.join(self.dir, 'untrained'), train_if_missing=True,
                  task='emnist_cnn', data_source='leaf', data_dir=missing)
    out = os.path.join(self.dir, 'untrained_out')
    with flagsaver.flagsaver(algorithm='fedpt', frozen_layers=['dense9'], **common):
      with self.assertRaisesRegex(
          flag_groups.FlagError,
          "^--frozen_layers: the model 'emnist_cnn' has no layer 'dense9' with weights; "
          'its layers are: conv1, conv2, dense1, dense2$'):
        adapt.run(out)
    with flagsaver.flagsaver(total_rounds=0, **common):
      with self.assertRaisesRegex(flag_groups.FlagError, '^--total_rounds'):
        adapt.run(out)
    # The runtime flags, as scripts.train reads them (they were ignored here).
    with flagsaver.flagsaver(workers=['10.0.0.5:10001'], **common):
      with self.assertRaisesRegex(
          flag_groups.FlagError,
          "^--workers: '10.0.0.5:10001' is not a loopback address; non-loopback "
          'addresses need --allow_remote_workers'):
        adapt.run(out)
    # Valid flags get as far as the data; nothing was written.
    with flagsaver.flagsaver(algorithm='fedpt', frozen_layers=['dense1'], **common):
      with self.assertRaisesRegex(ValueError, f'--data_dir={missing!r} does not exist'):
        adapt.run(out)
    self.assertFalse(os.path.exists(common['run_dir']))
    self.assertFalse(os.path.exists(out))

  def test_train_if_missing_refuses_more_clients_than_the_population(self):
    run_dir, out = os.path.join(self.dir, 'too_many'), os.path.join(self.dir, 'too_many_out')
    with flagsaver.flagsaver(run_dir=run_dir, train_if_missing=True, task='emnist_2nn',
                             data_source='synthetic', clients_per_round=5):
      with self.assertRaisesRegex(
          flag_groups.FlagError,
          r'^--clients_per_round=5 is larger than the population of --task=emnist_2nn '
          r'\(2 train clients\)$'):
        adapt.run(out)
    self.assertFalse(os.path.exists(run_dir))
    self.assertFalse(os.path.exists(out))

  def test_interrupted_adaptation_resumes_with_its_finished_rows(self):
    out = os.path.join(self.dir, 'resumed')
    settings = dict(run_dir=self.run_dir, results_dir=out, num_participants=2,
                    local_epochs=1, adapt_epochs=1, adapt_batch_size=4,
                    strategies=['finetune'], seed=1)
    original = evaluation.ParticipantEvaluator.evaluate
    calls = []

    def evaluate_then_die(evaluator, *args, **kwargs):
      calls.append(1)
      if len(calls) == 2:  # killed while adapting the second participant
        raise KeyboardInterrupt
      return original(evaluator, *args, **kwargs)

    csv_path = os.path.join(out, 'participants.csv')
    with flagsaver.flagsaver(**settings):
      with mock.patch.object(evaluation.ParticipantEvaluator, 'evaluate', evaluate_then_die):
        with self.assertRaises(KeyboardInterrupt):
          adapt.run(out)
      with open(csv_path) as f:
        first = f.read()
      self.assertEqual([r['participant'] for r in csv.DictReader(io.StringIO(first))],
                       ['synthetic1'])
      self.assertFalse(os.path.exists(os.path.join(out, 'summary.json')))
      # The rerun keeps the finished row as it was and adapts only the second.
      with mock.patch.object(evaluation.ParticipantEvaluator, 'evaluate',
                             autospec=True, side_effect=original) as spy:
        adapt.run(out)
      self.assertEqual(spy.call_count, 1)
    with open(csv_path) as f:
      lines = f.read().splitlines()
    self.assertEqual(lines[:2], first.splitlines())
    self.assertEqual([l.split(',')[0] for l in lines[1:]], ['synthetic1', 'synthetic2'])
    # Other flags on the same results: refused, not mixed in.
    with flagsaver.flagsaver(**dict(settings, adapt_epochs=2)):
      with self.assertRaisesRegex(ValueError, 'another adaptation'):
        adapt.run(out)

  def test_dirichlet_task_judged_by_class_ratio_accuracy(self):
    # cifar10_resnet18 (a Dirichlet label split, no per-client test data):
    # --metric=auto is the paper's class-ratio accuracy on the global test set.
    hparams = {'cifar10_num_clients': 4, 'cifar10_examples_per_client': 10,
               'cifar10_width': 4, 'cifar10_crop_size': 8}
    run_dir = os.path.join(self.dir, 'cifar')
    os.makedirs(run_dir)
    tf.keras.utils.set_random_seed(0)
    weights = cifar10.create_resnet18_gn(width=4, image_size=8).get_weights()
    np.savez(os.path.join(run_dir, 'model_weights.npz'), *weights)
    # Trained with --seed=3: the client split (and synthetic images) of seed 3
    # are the participants' data, whatever scripts.adapt's own --seed.
    with open(os.path.join(run_dir, 'flags.json'), 'w') as f:
      json.dump({'task': 'cifar10_resnet18', 'data_source': 'synthetic',
                 'data_dir': None, 'seed': 3, **hparams}, f)
    out = os.path.join(self.dir, 'cifar_out')
    with flagsaver.flagsaver(
        run_dir=run_dir, results_dir=out, num_participants=2, local_epochs=1,
        adapt_epochs=1, adapt_batch_size=5, strategies=['finetune'],
        global_test_per_class=3, seed=1):
      summary = adapt.run(out)
      task = flag_groups.create_task(seed=3)
      other_split = flag_groups.create_task(seed=1)
    self.assertEqual(summary['metric'], 'class_ratio_accuracy')
    self.assertEqual(summary['run']['data_seed'], 3)
    self.assertNotAllEqual(
        evaluation.participant_data(task, 'train_0', split='global_test').train_y,
        evaluation.participant_data(other_split, 'train_0', split='global_test').train_y)
    with open(os.path.join(out, 'participants.csv')) as f:
      rows = list(csv.DictReader(f))
    self.assertLen(rows, 2)
    # By hand: per-class accuracy of the federated model on the first 3 test
    # images of each class, weighted by the participant's class ratios.
    x, y = evaluation.global_test_data(task, max_per_class=3)
    self.assertLen(y, 30)
    model = cifar10.create_resnet18_gn(width=4, image_size=8)
    model.set_weights(weights)
    predicted = np.argmax(model.predict(x, verbose=0), axis=-1)
    correct = np.bincount(y[predicted == y], minlength=10) / 3
    for r in rows:
      self.assertEqual((r['split'], r['num_train'], r['num_test']), ('global_test', '10', '30'))
      labels = evaluation.participant_data(task, r['participant'], split='global_test').train_y
      ratios = np.bincount(labels, minlength=10) / len(labels)
      self.assertAlmostEqual(float(r['federated']), float(np.dot(ratios, correct)), places=6)
    with flagsaver.flagsaver(run_dir=run_dir, split='in_order'):
      with self.assertRaisesRegex(ValueError, '--split=in_order does not apply'):
        adapt.run(out)

  def test_bad_flags_raise_clear_errors(self):
    with flagsaver.flagsaver(run_dir=self.run_dir, task='emnist_2nn'):
      with self.assertRaisesRegex(ValueError, '--task=.*contradicts the run'):
        adapt.run(os.path.join(self.dir, 'x'))
    with flagsaver.flagsaver(run_dir=self.run_dir, strategies=['finetune', 'magic']):
      with self.assertRaisesRegex(ValueError, '--strategies'):
        adapt.run(os.path.join(self.dir, 'x'))
    empty = os.path.join(self.dir, 'empty')
    os.makedirs(empty)
    with flagsaver.flagsaver(run_dir=empty, data_source='synthetic'):
      with self.assertRaisesRegex(ValueError, 'no model_weights.npz'):
        adapt.run(os.path.join(self.dir, 'x'))
    with flagsaver.flagsaver(run_dir=None):
      with self.assertRaisesRegex(ValueError, '--run_dir is required'):
        adapt.run(os.path.join(self.dir, 'x'))


if __name__ == '__main__':
  tf.test.main()
