"""Smoke and bad-input tests of the training binary `scripts.train`."""

import json
import os

from absl import flags
import tensorflow as tf

from scripts import train  # pylint: disable=unused-import  (defines the flags)
from tests import testing_utils
from tff_partial.bench import machine

FLAGS = flags.FLAGS


_run_main = testing_utils.run_train_main


class TrainBinaryTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.root = self.create_tempdir().full_path

  def test_two_rounds_on_synthetic_data(self):
    code, out, _ = _run_main(
        task='emnist_2nn', data_source='synthetic', total_rounds=2,
        clients_per_round=1, root_output_dir=self.root, experiment_name='smoke',
        client_max_batches=2)
    self.assertEqual(code, 0)
    lines = [l for l in out.splitlines() if l.startswith('round ')]
    self.assertLen(lines, 3)  # round 0 (initial model), 1, 2
    self.assertIn('round 2/2', lines[-1])
    self.assertIn('down 0.839 MB up 0.839 MB', lines[-1])  # 4 x 209,662 bytes
    run_dir = os.path.join(self.root, 'smoke')
    for name in ('metrics.csv', 'flags.json', 'model_weights.npz', 'final_eval.json',
                 'checkpoints', 'tensorboard'):
      self.assertTrue(os.path.exists(os.path.join(run_dir, name)), name)
    with open(os.path.join(run_dir, 'metrics.csv')) as f:
      rows = f.read().strip().splitlines()
    self.assertLen(rows, 4)  # header + rounds 0..2
    self.assertIn('comm/bytes_up_per_client', rows[0])
    with open(os.path.join(run_dir, 'flags.json')) as f:
      self.assertEqual(json.load(f)['cpu_path_resolved'], machine.cpu_path())

  def test_dry_run_reports_the_contract_keys(self):
    code, out, _ = _run_main(task='emnist_cnn', data_source='synthetic', dry_run=True,
                             clients_per_round=1)
    self.assertEqual(code, 0)
    report = json.loads(out.strip().splitlines()[-1])
    self.assertEqual(report['params_total'], 1_690_046)
    self.assertEqual(report['params_trainable'], 1_690_046)
    self.assertEqual(report['trainable_fraction'], 1.0)
    self.assertEqual(report['client_model_fraction'], 1.0)
    self.assertEqual(report['bytes_down_per_client'], 4 * 1_690_046)
    self.assertEqual(report['bytes_up_per_client'], 4 * 1_690_046)
    self.assertEqual(report['comm_reduction_vs_fedavg'], 1.0)
    self.assertIsNone(report['epsilon'])
    self.assertEqual(report['data_source'], 'synthetic')

  def _assert_fails(self, expected_text, **flag_values):
    flag_values.setdefault('root_output_dir', self.root)
    flag_values.setdefault('experiment_name', 'bad')
    code, _, err = _run_main(**flag_values)
    self.assertEqual(code, 2, err)
    self.assertIn(expected_text, err)
    self.assertEqual(len(err.strip().splitlines()), 1, err)
    self.assertFalse(os.path.exists(os.path.join(self.root, 'bad')))

  def test_unknown_task(self):
    self._assert_fails('--task=\'mnist\' is not a known task; valid values: emnist_cnn',
                       task='mnist', data_source='synthetic')

  def test_non_positive_rounds_and_clients(self):
    self._assert_fails('--total_rounds=0 must be a positive integer',
                       total_rounds=0, data_source='synthetic')
    self._assert_fails('--clients_per_round=-3 must be a positive integer',
                       clients_per_round=-3, data_source='synthetic')

  def test_more_clients_than_population(self):
    self._assert_fails('--clients_per_round=5 is larger than the population',
                       clients_per_round=5, data_source='synthetic')

  def test_missing_and_malformed_data_dir(self):
    self._assert_fails('does not exist', data_source='leaf',
                       data_dir=os.path.join(self.root, 'nope'))
    empty = self.create_tempdir().full_path
    os.makedirs(os.path.join(empty, 'train'))
    os.makedirs(os.path.join(empty, 'test'))
    self._assert_fails('no train/*.json files', data_source='leaf', data_dir=empty)
    with open(os.path.join(empty, 'train', 'a.json'), 'w') as f:
      f.write('{not json')
    self._assert_fails('is not a LEAF json shard', data_source='leaf', data_dir=empty)

  def test_layer_flags_are_checked_against_the_model_before_the_data_loads(self):
    # The data directory does not exist: an error about it would mean the
    # data was read before the layer flags were checked.
    missing = os.path.join(self.root, 'no_data')
    self._assert_fails(
        "--frozen_layers: the model 'emnist_cnn' has no layer 'dense9' with weights; its "
        'layers are: conv1, conv2, dense1, dense2', task='emnist_cnn', algorithm='fedpt',
        frozen_layers=['dense9'], data_source='leaf', data_dir=missing)
    self._assert_fails(
        '--select_keys=65 for conv2: must be between 1 and the maximum 64', task='emnist_cnn',
        algorithm='select', select_layer=['conv2'], select_keys=65, data_source='leaf',
        data_dir=missing)
    self._assert_fails(
        "--select_layer='conv3' is not a selectable layer of emnist_2nn; valid values: "
        'dense1, dense2, dense3', task='emnist_2nn', algorithm='select',
        select_layer=['conv3'], select_keys=4, data_source='leaf', data_dir=missing)
    # Valid layer flags get as far as the data.
    self._assert_fails(f'--data_dir={missing!r} does not exist', task='emnist_cnn',
                       algorithm='fedpt', frozen_layers=['dense1'], data_source='leaf',
                       data_dir=missing)

  def test_offline_default_says_how_to_point_at_local_data(self):
    self._assert_fails('--data_source=leaf --data_dir=', data_source='auto',
                       cache_dir=self.create_tempdir().full_path)

  def test_flag_of_another_task_is_rejected(self):
    flag_names = [f for f in FLAGS if f.startswith('cifar10_')]
    if not flag_names:
      self.skipTest('no other task family registered')
    self._assert_fails('does not apply to --task=emnist_cnn', data_source='synthetic',
                       **{flag_names[0]: FLAGS[flag_names[0]].default + 1})

  def test_output_dir_with_different_flags(self):
    code, _, _ = _run_main(task='emnist_2nn', data_source='synthetic', total_rounds=1,
                           clients_per_round=1, root_output_dir=self.root,
                           experiment_name='run', client_max_batches=1)
    self.assertEqual(code, 0)
    before = sorted(os.listdir(os.path.join(self.root, 'run')))
    code, _, err = _run_main(task='emnist_2nn', data_source='synthetic', total_rounds=1,
                             clients_per_round=1, root_output_dir=self.root,
                             experiment_name='run', client_max_batches=1,
                             client_learning_rate=0.5)
    self.assertEqual(code, 2)
    self.assertIn('holds a run with different flags (--client_learning_rate', err)
    self.assertEqual(before, sorted(os.listdir(os.path.join(self.root, 'run'))))


if __name__ == '__main__':
  tf.test.main()
