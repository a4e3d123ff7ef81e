"""Tests of scripts.methods.aggregators: flags, validation, and every
aggregator composed with FedAvg on a tiny EMNIST task."""

# bazel: size=large
import contextlib

from absl import flags
from absl.testing import flagsaver
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from scripts import flag_groups
from scripts.methods import aggregators
from scripts.methods import fedavg
from tasks import registry
from tests import testing_utils
from tff_partial import privacy
from tff_partial.privacy import accounting
from tff_partial.training import method


class _FakeTask:
  population = 1000


class AggregatorFlagsTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()

  def _build(self, clients_per_round=10, total_rounds=50, **flag_values):
    with flagsaver.flagsaver(**flag_values):
      aggregators.validate_flags('fedavg')
      return aggregators.build(_FakeTask(), clients_per_round, total_rounds, None)

  def test_mean_is_the_default(self):
    choice = self._build()
    self.assertIsNone(choice.factory)
    self.assertIsNone(choice.epsilon_fn)
    self.assertIsNone(choice.server_optimizer)

  def test_median(self):
    choice = self._build(aggregator='median')
    self.assertIsInstance(choice.factory, privacy.CoordinateMedianFactory)
    self.assertIsNone(choice.epsilon_fn)

  def test_dp_ftrl(self):
    choice = self._build(aggregator='dp_ftrl', noise_multiplier=1.5, clip_norm=0.3,
                         target_delta=1e-4, server_optimizer='sgdm',
                         server_learning_rate=0.5, server_momentum=0.9)
    self.assertIsInstance(choice.factory, privacy.DPFTRLFactory)
    self.assertEqual(choice.factory.restart_period, 100)
    self.assertEqual(choice.factory.clip_norm, 0.3)
    self.assertIsNotNone(choice.server_optimizer)
    self.assertAlmostEqual(choice.epsilon_fn(50),
                           accounting.dp_ftrl_epsilon(1.5, 50, 10, 1000, 1e-4))
    self.assertLess(choice.epsilon_fn(10), choice.epsilon_fn(50))
    first_epoch = np.concatenate([choice.client_indices_fn(r) for r in range(1, 101)])
    self.assertLen(set(first_epoch.tolist()), 1000)  # each client once per epoch
    # The server optimizer is SGD with momentum 0.9 at lr 0.5.
    opt = choice.server_optimizer
    state = opt.initialize(tf.TensorSpec([1], tf.float32))
    _, w = opt.next(state, tf.constant([0.0]), tf.constant([1.0]))
    self.assertAllClose(w, [-0.5])
    self.assertAllClose(dict(state)['momentum'], 0.9)

  def test_dp_gaussian_default_delta_is_one_over_population(self):
    choice = self._build(aggregator='dp_gaussian', noise_multiplier=1.0, clip_norm=0.1)
    # TFF's gaussian_fixed composition (NormalizedQuery over GaussianSumQuery),
    # with the sum itself for PVT.
    self.assertIsInstance(choice.factory, privacy.DPMeanFactory)
    self.assertIsInstance(choice.factory.sum_factory, privacy.GaussianSumFactory)
    self.assertEqual(choice.factory.denominator, 10.0)
    self.assertEqual(choice.statistic, 'fixed_denominator_mean')
    self.assertIsNone(choice.privacy_note)
    self.assertAlmostEqual(choice.target_delta, 1e-3)
    self.assertAlmostEqual(choice.epsilon_fn(50),
                           accounting.dp_fedavg_epsilon(1.0, 50, 10, 1000, 1e-3))
    choice = self._build(aggregator='dp_gaussian', noise_multiplier=1.0, clip_norm=0.1,
                         clients_per_round=100, dp_adaptive_clip=True,
                         dp_sampling='without_replacement', deterministic=False)
    self.assertAlmostEqual(
        choice.epsilon_fn(50),
        accounting.dp_fedavg_epsilon(1.0, 50, 100, 1000, 1e-3, 'without_replacement'))
    with self.assertRaisesRegex(flag_groups.FlagError, 'noise_multiplier.*clients_per_round'):
      self._build(aggregator='dp_gaussian', noise_multiplier=1.0, dp_adaptive_clip=True,
                  deterministic=False)
    # TFF's adaptive clip draws unseeded noise: refused under op determinism.
    with self.assertRaisesRegex(flag_groups.FlagError,
                                '--dp_adaptive_clip needs --nodeterministic'):
      self._build(aggregator='dp_gaussian', noise_multiplier=1.0, dp_adaptive_clip=True)

  def test_noise_seed_is_secret_unless_given(self):
    for name in ('dp_ftrl', 'dp_gaussian'):
      with self.subTest(name):
        choice = self._build(aggregator=name, seed=5)
        self.assertFalse(choice.factory.sum_factory.noise_seed_is_public)
        self.assertIsNone(choice.privacy_note)
        choice = self._build(aggregator=name, dp_noise_seed=5)
        self.assertTrue(choice.factory.sum_factory.noise_seed_is_public)
        self.assertEqual(choice.privacy_note, aggregators.PRIVACY_NOTE)
    with self.assertRaisesRegex(flag_groups.FlagError, '--dp_noise_seed.*--dp_adaptive_clip'):
      self._build(aggregator='dp_gaussian', dp_noise_seed=5, dp_adaptive_clip=True)

  def test_bad_input_names_the_flag(self):
    cases = [
        (dict(aggregator='dp_ftrl', noise_multiplier=-1.0), '--noise_multiplier'),
        (dict(aggregator='dp_gaussian', clip_norm=0.0), '--clip_norm'),
        (dict(aggregator='dp_gaussian', clip_norm=-2.0), '--clip_norm'),
        (dict(aggregator='dp_ftrl', target_delta=1.0), '--target_delta'),
        (dict(aggregator='dp_gaussian', target_delta=0.0), '--target_delta'),
        (dict(aggregator='dp_ftrl', server_optimizer='adam'), '--server_optimizer'),
        (dict(aggregator='median', clip_norm=0.3), '--clip_norm'),
        (dict(aggregator='mean', noise_multiplier=1.0), '--noise_multiplier'),
        (dict(aggregator='dp_ftrl', dp_adaptive_clip=True), '--dp_adaptive_clip'),
        (dict(aggregator='dp_gaussian', dp_ftrl_restart=False), '--dp_ftrl_restart'),
    ]
    for flag_values, flag_name in cases:
      with self.subTest(flag=flag_name, values=str(flag_values)):
        with self.assertRaisesRegex(flag_groups.FlagError, flag_name):
          self._build(**flag_values)
    with self.assertRaisesRegex(flag_groups.FlagError, '--clients_per_round'):
      self._build(clients_per_round=5000, aggregator='dp_ftrl')
    with self.assertRaisesRegex(flag_groups.FlagError, 'dp_ftrl_restart'):
      self._build(total_rounds=101, aggregator='dp_ftrl', dp_ftrl_restart=False)

  def test_flag_names_are_the_dp_flags(self):
    self.assertCountEqual(aggregators.FLAG_NAMES, (
        'noise_multiplier', 'clip_norm', 'target_delta', 'dp_adaptive_clip',
        'dp_sampling', 'dp_ftrl_restart', 'dp_noise_seed'))
    for name in aggregators.FLAG_NAMES:
      self.assertIn(name, flags.FLAGS)


class FedAvgCompositionTest(tf.test.TestCase):
  """Every aggregator plugs into FedAvg as `ctx.model_aggregator`."""

  def test_fedavg_with_each_aggregator_runs_a_round(self):
    task = registry.create_task(
        'emnist_2nn', train_client_spec=testing_utils.client_spec(batch_size=10, max_elements=20),
        data_source='synthetic', seed=0)
    clients = [task.train_data.create_tf_dataset_for_client(cid)
               for cid in task.train_data.client_ids[:2]]
    clients = [task.baseline.datasets.train_preprocess_fn(ds) for ds in clients]
    factories = {
        'dp_ftrl': privacy.build_dp_ftrl_factory(1.0, 2, 0.1, population=task.population,
                                                 noise_seed=1),
        'dp_gaussian': privacy.build_dp_gaussian_factory(1.0, 2, 0.1),
        'median': privacy.build_median_factory(),
    }
    for name, factory in factories.items():
      with self.subTest(name):
        ctx = method.MethodContext(
            task=task, client_optimizer=tff.learning.optimizers.build_sgdm(0.05),
            server_optimizer=privacy.build_dp_ftrl_server_optimizer(1.0, 0.9),
            model_aggregator=factory, clients_per_round=2)
        built = fedavg.build(ctx)
        state = built.process.initialize()
        before = built.process.get_model_weights(state).trainable
        out = built.process.next(state, clients)
        after = built.process.get_model_weights(out.state).trainable
        delta = np.concatenate([np.ravel(a - b) for a, b in zip(after, before)])
        self.assertTrue(np.all(np.isfinite(delta)))
        self.assertGreater(np.linalg.norm(delta), 0.0)
        if name != 'median':
          # One round of server SGD (lr 1, momentum starts at 0) moves the model
          # by the aggregate: clipped mean + noise of std clip*z/cpr = 0.05.
          self.assertAllClose(np.std(delta), 0.05, rtol=0.1)
        # Bytes are measured on the process: the DP aggregator adds no client traffic.
        self.assertEqual(built.bytes.up_payload, built.bytes.down_payload)


if __name__ == '__main__':
  tf.test.main()


class TrainBinaryTest(tf.test.TestCase):
  """`scripts.train` with DP aggregators: --dry_run epsilon and a short run."""

  def setUp(self):
    super().setUp()
    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()

  def _main(self, **flag_values):
    from scripts import train  # pylint: disable=g-import-not-at-top
    # A real file, not StringIO: TFF starts its executor as a subprocess that
    # inherits stdout's file descriptor.
    out_path = self.create_tempfile().full_path
    with flagsaver.flagsaver(task='emnist_2nn', data_source='synthetic', client_max_batches=2,
                             clients_per_round=1, **flag_values):
      with open(out_path, 'w') as out, contextlib.redirect_stdout(out):
        train.main(['train'])
    with open(out_path) as f:
      return f.read().strip().splitlines()

  def test_dry_run_reports_epsilon_of_the_planned_run(self):
    import json  # pylint: disable=g-import-not-at-top
    report = json.loads(self._main(
        aggregator='dp_ftrl', noise_multiplier=2.0, clip_norm=0.3, target_delta=1e-3,
        total_rounds=7, server_optimizer='sgdm', dry_run=True)[-1])
    population = report['population']
    self.assertAlmostEqual(
        report['epsilon'], accounting.dp_ftrl_epsilon(2.0, 7, 1, population, 1e-3))
    report = json.loads(self._main(aggregator='median', total_rounds=3, dry_run=True)[-1])
    self.assertIsNone(report['epsilon'])

  def test_two_rounds_log_epsilon_so_far(self):
    output_dir = self.create_tempdir().full_path
    lines = self._main(
        aggregator='dp_gaussian', noise_multiplier=1.0, clip_norm=0.1, target_delta=1e-3,
        total_rounds=2, root_output_dir=output_dir, experiment_name='dp')
    import csv  # pylint: disable=g-import-not-at-top
    import os  # pylint: disable=g-import-not-at-top
    with open(os.path.join(output_dir, 'dp', 'metrics.csv')) as f:
      rows = {int(r['round_num']): r for r in csv.DictReader(f)}
    population = registry.create_task(
        'emnist_2nn', train_client_spec=testing_utils.client_spec(),
        data_source='synthetic').population
    for r in (1, 2):
      self.assertAlmostEqual(float(rows[r]['privacy/epsilon']),
                             accounting.dp_fedavg_epsilon(1.0, r, 1, population, 1e-3), places=5)
    self.assertLess(float(rows[1]['privacy/epsilon']), float(rows[2]['privacy/epsilon']))
    self.assertTrue(any('epsilon' in line for line in lines))
