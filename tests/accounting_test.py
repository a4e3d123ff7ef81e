"""Tests of tff_partial.privacy.accounting and the scripts.privacy CLI."""

import io
import json
import math
from unittest import mock

from absl import flags
from absl.testing import absltest
from absl.testing import flagsaver
import dp_accounting

from scripts import privacy as privacy_cli
from tff_partial.privacy import accounting

_REL = dp_accounting.NeighboringRelation


def _rdp_epsilon(event, relation, delta):
  acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=relation)
  acc.compose(event)
  return acc.get_epsilon(delta)


class DPFTRLAccountingTest(absltest.TestCase):

  def test_single_epoch_equals_dp_accounting_event(self):
    eps = accounting.dp_ftrl_epsilon(1.0, 100, 10, 1000, 1e-5)
    expected = _rdp_epsilon(dp_accounting.SingleEpochTreeAggregationDpEvent(1.0, 100),
                            _REL.REPLACE_SPECIAL, 1e-5)
    self.assertAlmostEqual(eps, expected, places=10)
    self.assertTrue(math.isfinite(eps) and eps > 0)

  def test_restarts_compose_one_tree_per_epoch(self):
    # 250 rounds, 100 rounds per epoch: two full trees and one of 50 rounds.
    eps = accounting.dp_ftrl_epsilon(2.0, 250, 10, 1000, 1e-5)
    event = dp_accounting.ComposedDpEvent([
        dp_accounting.SingleEpochTreeAggregationDpEvent(2.0, 100),
        dp_accounting.SingleEpochTreeAggregationDpEvent(2.0, 100),
        dp_accounting.SingleEpochTreeAggregationDpEvent(2.0, 50)])
    self.assertAlmostEqual(eps, _rdp_epsilon(event, _REL.REPLACE_SPECIAL, 1e-5), places=10)
    self.assertGreater(eps, accounting.dp_ftrl_epsilon(2.0, 100, 10, 1000, 1e-5))

  def test_monotone_in_noise_and_rounds(self):
    by_noise = [accounting.dp_ftrl_epsilon(z, 200, 10, 1000, 1e-5) for z in (0.5, 1.0, 2.0, 4.0)]
    self.assertEqual(by_noise, sorted(by_noise, reverse=True))
    self.assertGreater(by_noise[0], by_noise[-1] * 4)
    by_rounds = [accounting.dp_ftrl_epsilon(1.0, r, 10, 1000, 1e-5) for r in (1, 10, 100, 400)]
    self.assertEqual(by_rounds, sorted(by_rounds))
    self.assertLess(by_rounds[0], by_rounds[-1])
    self.assertEqual(accounting.dp_ftrl_epsilon(1.0, 0, 10, 1000, 1e-5), 0.0)
    self.assertEqual(accounting.dp_ftrl_epsilon(0.0, 5, 10, 1000, 1e-5), math.inf)

  def test_without_restart_beyond_one_epoch_is_refused(self):
    with self.assertRaisesRegex(ValueError, 'restart'):
      accounting.dp_ftrl_epsilon(1.0, 101, 10, 1000, 1e-5, restart=False)
    self.assertAlmostEqual(
        accounting.dp_ftrl_epsilon(1.0, 100, 10, 1000, 1e-5, restart=False),
        accounting.dp_ftrl_epsilon(1.0, 100, 10, 1000, 1e-5))


class DPFedAvgAccountingTest(absltest.TestCase):

  def test_poisson_equals_dp_accounting_event(self):
    eps = accounting.dp_fedavg_epsilon(1.1, 300, 20, 2000, 1e-5, sampling='poisson')
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1)), 300)
    self.assertAlmostEqual(eps, _rdp_epsilon(event, _REL.ADD_OR_REMOVE_ONE, 1e-5), places=10)

  def test_without_replacement_equals_dp_accounting_event(self):
    eps = accounting.dp_fedavg_epsilon(1.1, 300, 20, 2000, 1e-5, sampling='without_replacement')
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.SampledWithoutReplacementDpEvent(
            2000, 20, dp_accounting.GaussianDpEvent(0.55)), 300)
    self.assertAlmostEqual(eps, _rdp_epsilon(event, _REL.REPLACE_ONE, 1e-5), places=10)

  def test_monotone_in_noise_and_rounds(self):
    by_noise = [accounting.dp_fedavg_epsilon(z, 100, 10, 1000, 1e-5) for z in (0.7, 1.0, 2.0)]
    self.assertEqual(by_noise, sorted(by_noise, reverse=True))
    by_rounds = [accounting.dp_fedavg_epsilon(1.0, r, 10, 1000, 1e-5) for r in (1, 50, 500)]
    self.assertEqual(by_rounds, sorted(by_rounds))
    self.assertLess(by_rounds[0], by_rounds[1])

  def test_bad_input(self):
    for delta in (0.0, 1.0, -1e-5, 2.0):
      with self.assertRaisesRegex(ValueError, 'target_delta'):
        accounting.dp_fedavg_epsilon(1.0, 10, 10, 1000, delta)
      with self.assertRaisesRegex(ValueError, 'target_delta'):
        accounting.dp_ftrl_epsilon(1.0, 10, 10, 1000, delta)
    with self.assertRaisesRegex(ValueError, 'noise_multiplier'):
      accounting.dp_fedavg_epsilon(-1.0, 10, 10, 1000, 1e-5)
    with self.assertRaisesRegex(ValueError, 'rounds'):
      accounting.dp_ftrl_epsilon(1.0, -3, 10, 1000, 1e-5)
    with self.assertRaisesRegex(ValueError, 'clients_per_round'):
      accounting.dp_fedavg_epsilon(1.0, 10, 2000, 1000, 1e-5)
    with self.assertRaisesRegex(ValueError, 'sampling'):
      accounting.dp_fedavg_epsilon(1.0, 10, 10, 1000, 1e-5, sampling='shuffle')


class PrivacyCliTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()  # under pytest nobody parses argv

  def _run(self, **flag_values):
    with flagsaver.flagsaver(**flag_values):
      with mock.patch('sys.stdout', new_callable=io.StringIO) as out:
        privacy_cli.main(['privacy'])
    return json.loads(out.getvalue().strip().splitlines()[-1])

  def test_prints_epsilon_json_last(self):
    report = self._run(mechanism='dp_ftrl', noise_multiplier=1.0, rounds=1600,
                       clients_per_round=100, population=342477, target_delta=1e-6)
    self.assertAlmostEqual(
        report['epsilon'], accounting.dp_ftrl_epsilon(1.0, 1600, 100, 342477, 1e-6))
    report = self._run(mechanism='dp_gaussian', noise_multiplier=1.0, rounds=100,
                       clients_per_round=10, population=1000)
    self.assertAlmostEqual(report['target_delta'], 1e-3)
    self.assertAlmostEqual(
        report['epsilon'],
        accounting.dp_fedavg_epsilon(1.0, 100, 10, 1000, 1e-3, sampling='without_replacement'))

  def test_bad_flags_name_the_flag(self):
    base = dict(mechanism='dp_ftrl', noise_multiplier=1.0, rounds=10,
                clients_per_round=10, population=100)
    for override, flag in ((dict(noise_multiplier=-1.0), '--noise_multiplier'),
                           (dict(target_delta=1.5), '--target_delta'),
                           (dict(clients_per_round=1000), '--clients_per_round'),
                           (dict(rounds=-1), '--rounds'),
                           (dict(dp_sampling='poisson'), '--dp_sampling')):
      with self.subTest(flag=flag):
        with self.assertRaisesRegex(Exception, flag):
          self._run(**{**base, **override})


if __name__ == '__main__':
  absltest.main()
