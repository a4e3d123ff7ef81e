"""Tests of scripts/methods/select.py: dry-run numbers, flag errors, real data."""

import tensorflow as tf

from scripts import flag_groups
from scripts.methods import select
from tasks import registry
from tests import testing_utils
from tff_partial.training import method


def _ctx(task, client_lr=0.1, seed=0):
  return testing_utils.method_context(task, client_lr=client_lr, seed=seed)


def _synthetic(name):
  return registry.create_task(
      name, train_client_spec=testing_utils.client_spec(max_elements=2),
      data_source='synthetic')


class DryRunTest(tf.test.TestCase):

  def test_emnist_2nn_dense1_units_fraction_and_bytes(self):
    task = _synthetic('emnist_2nn')
    m = 50
    built = select.build_from_args(_ctx(task), ['dense1'], m, 'random')
    report = method.dry_run_report(built, task, epsilon=None)
    held = 784 * m + m + m * 200 + 200 + 12_462
    self.assertEqual(report['params_total'], 209_662)
    self.assertEqual(report['client_model_fraction'], held / 209_662)
    self.assertAlmostEqual(report['client_model_fraction'], 0.2953, places=4)  # paper: 0.30
    self.assertEqual(report['bytes_down_per_client'], 4 * held)
    # Up: the trained slices + broadcast deltas, and the m int32 keys twice.
    self.assertEqual(report['bytes_up_per_client'], 4 * held + 2 * 4 * m)
    self.assertEqual(report['select_groups']['dense1']['num_keys'], 200)

  def test_flag_errors_name_the_flag(self):
    task = _synthetic('emnist_cnn')
    with self.assertRaisesRegex(flag_groups.FlagError,
                                r'--select_layer=.*conv3.*conv1, conv2, dense1, dense2'):
      select.select_spec(task, ['conv3'], 8, 'random')
    with self.assertRaisesRegex(flag_groups.FlagError, r'--select_keys=100.*maximum 64'):
      select.select_spec(task, ['conv2'], 100, 'random')


class FemnistLearnsTest(tf.test.TestCase):
  """emnist_cnn with m=16 random conv2 filters per client on real FEMNIST."""

  def test_random_conv2_filters_learn(self):
    task = testing_utils.femnist_task('emnist_cnn')
    built = select.build_from_args(_ctx(task), ['conv2'], 16, 'random')
    self.assertAlmostEqual(built.client_model_params / built.params_total, 0.2647, places=4)
    testing_utils.train_and_assert_learns(
        self, task, built, rounds=ROUNDS, min_accuracy=MIN_ACCURACY)


ROUNDS = 20
# Measured 2026-11-21 (seed 0, 20 rounds x 10 writers, m=16 of 64 filters,
# client SGD 0.1, batch 20, server SGD 1.0): test accuracy 0.054 on all test
# images (chance 0.016; FedAvg 0.133 after 15 rounds). Random filters learn
# slower early on (the paper trains 1,500 rounds); asserted with a margin.
MIN_ACCURACY = 0.035

if __name__ == '__main__':
  tf.test.main()
