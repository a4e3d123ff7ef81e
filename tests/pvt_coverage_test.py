"""PVT coverage (tff_partial.masks.coverage, scripts.pvt_coverage): exact by hand."""

import contextlib
import io
import json
import math
import os

from absl import flags
from absl.testing import absltest
from absl.testing import flagsaver
import numpy as np

from scripts import pvt_coverage
from tff_partial.masks import coverage
from tff_partial.masks import schemes
from tff_partial.masks import variable_types as vt

FLAGS = flags.FLAGS
M, A = vt.MULTIPLICATIVE_MATRIX, vt.ADDITIVE_VECTOR


def _write_run(run_dir, counts, **flag_values):
  os.makedirs(run_dir)
  saved = {'algorithm': 'pvt', 'task': 'emnist_cnn', 'pvt_scheme': 'per_client_per_round',
           'pvt_freeze_fraction': 0.5, 'pvt_freeze_matrices_first': False,
           'clients_per_round': 2, 'seed': 0}
  saved.update(flag_values)
  with open(os.path.join(run_dir, 'flags.json'), 'w') as f:
    json.dump(saved, f)
  with open(os.path.join(run_dir, 'metrics.csv'), 'w') as f:
    f.write('round_num,evaluation/accuracy,aggregator/clients_per_variable\n0,0.1,\n')
    for r, row in enumerate(counts, start=1):
      f.write(f'{r},0.5,"{json.dumps(row)}"\n')


class ObservedTest(absltest.TestCase):

  def test_statistics_by_hand(self):
    # Variable 0: trained in rounds 2 and 5 of 6; variable 1: every round;
    # variable 2: never.
    counts = np.array([[0, 3, 0], [2, 3, 0], [0, 3, 0], [0, 3, 0], [1, 3, 0], [0, 3, 0]])
    got = coverage.observed(counts)
    np.testing.assert_allclose(got.mean_clients, [3 / 6, 3, 0])
    np.testing.assert_allclose(got.untrained_share, [4 / 6, 0, 1])
    # Staleness after each round: var 0: 1,0,1,2,0,1; var 2: 1..6.
    np.testing.assert_allclose(got.mean_staleness, [5 / 6, 0, 21 / 6])
    np.testing.assert_array_equal(got.longest_gap, [2, 0, 6])

  def test_bad_shape_is_refused(self):
    with self.assertRaisesRegex(coverage.CoverageError, r'\[rounds, variables\]'):
      coverage.observed(np.zeros([0, 3]))


class ExpectedTest(absltest.TestCase):

  def test_formulas(self):
    p = [0.1, 1.0, 0.0]
    pcpr = coverage.expected(p, 10, 'per_client_per_round')
    q = 0.9**10
    np.testing.assert_allclose(pcpr.mean_clients, [1.0, 10.0, 0.0])
    np.testing.assert_allclose(pcpr.untrained_share, [q, 0.0, 1.0])
    np.testing.assert_allclose(pcpr.mean_staleness[:2], [q / (1 - q), 0.0])
    self.assertTrue(math.isinf(pcpr.mean_staleness[2]))
    per_round = coverage.expected(p, 10, 'per_round')
    np.testing.assert_allclose(per_round.untrained_share, [0.9, 0.0, 1.0])
    np.testing.assert_allclose(per_round.mean_staleness[:2], [9.0, 0.0])

  def test_expected_matches_the_sampler(self):
    # 10 freezable matrices, 9 frozen per client (p = 0.1), 10 clients, 3,000
    # rounds of the real PCPR sampler: q = 0.9^10 = 0.3487 per variable.
    types = [M] * 10 + [A] * 2
    sampler = schemes.MaskSampler(types, 'per_client_per_round', 0.9, seed=3)
    rounds, clients = 3000, 10
    counts = np.array([
        sum(sampler.mask(r, c) for c in range(clients)) for r in range(1, rounds + 1)
    ]).astype(np.int64)
    got = coverage.observed(counts)
    want = coverage.expected(sampler.trained_probability(), clients, 'per_client_per_round')
    np.testing.assert_allclose(want.untrained_share[:10], 0.9**10)
    # Pooled over 10 variables x 3,000 rounds: the standard error of the share
    # is sqrt(q (1 - q) / 30000) = 0.0028; allow 4 of them.
    self.assertAlmostEqual(got.untrained_share[:10].mean(), 0.9**10, delta=0.011)
    self.assertAlmostEqual(got.mean_clients[:10].mean(), 1.0, delta=0.02)
    np.testing.assert_array_equal(got.mean_clients[10:], [10, 10])
    q = 0.9**10
    self.assertAlmostEqual(got.mean_staleness[:10].mean(), q / (1 - q), delta=0.05)


class ReadCountsTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.path = self.create_tempfile('metrics.csv').full_path

  def _write(self, text):
    with open(self.path, 'w') as f:
      f.write(text)

  def test_skips_round_0_and_keeps_the_last_row_of_a_round(self):
    self._write('round_num,aggregator/clients_per_variable\n0,\n1,"[1, 2]"\n'
                '2,"[0, 2]"\n2,"[2, 2]"\n')
    rounds, counts = coverage.read_counts(self.path)
    np.testing.assert_array_equal(rounds, [1, 2])
    np.testing.assert_array_equal(counts, [[1, 2], [2, 2]])

  def test_errors(self):
    self._write('round_num,evaluation/accuracy\n1,0.5\n')
    with self.assertRaisesRegex(coverage.CoverageError, 'not a --algorithm=pvt run'):
      coverage.read_counts(self.path)
    self._write('round_num,aggregator/clients_per_variable\n1,"[1]"\n3,"[1]"\n')
    with self.assertRaisesRegex(coverage.CoverageError, r'not 1\.\.2 \(first 1, last 3\)'):
      coverage.read_counts(self.path)


class BinaryTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    if not FLAGS.is_parsed():
      FLAGS.mark_as_parsed()
    self.dir = self.create_tempdir().full_path

  def _main(self, **flag_values):
    out, err = io.StringIO(), io.StringIO()
    with flagsaver.flagsaver(**flag_values), contextlib.redirect_stdout(out), \
        contextlib.redirect_stderr(err):
      code = pvt_coverage.main(['pvt_coverage'])
    return code, out.getvalue(), err.getvalue()

  def test_a_group_of_two_seeds_by_hand(self):
    # emnist_cnn: conv1, conv2, dense1, dense2 kernels (freezable) and biases;
    # 2 clients per round, 2 of 4 kernels frozen per client: p = 0.5, q = 0.25.
    config = os.path.join(self.dir, 'runs', 'pvt_pcpr')
    _write_run(os.path.join(config, 'seed_0'),
               [[2, 2, 0, 2, 1, 2, 1, 2], [1, 2, 1, 2, 2, 2, 0, 2]])
    _write_run(os.path.join(config, 'seed_1'),
               [[1, 2, 1, 2, 1, 2, 1, 2], [2, 2, 2, 2, 0, 2, 0, 2]], seed=1)
    output = os.path.join(self.dir, 'coverage.md')
    code, out, err = self._main(runs=[config], per_variable=True, output=output)
    self.assertEqual(code, 0, err)
    # Kernel counts over 2 seeds x 2 rounds: 16 cells summing to 16 (1.00 clients
    # per round); 4 zeros (seed 0: conv2 in round 1, dense2 in round 2; seed 1:
    # dense1 and dense2 in round 2): 0.250; each zero is a one-round gap, so the
    # staleness after the 16 (variable, round) pairs sums to 4: 0.25.
    self.assertIn('| pvt_pcpr | 2 x 2 | 2 | per_client_per_round 0.5 | 2 of 4 '
                  '| 1.00 (1.00) | 0.250 (0.250) | 0.25 (0.33) | 1 |', out)
    self.assertIn('| conv2/kernel:0 | multiplicative_matrix | 0.500 | 1.00 (1.00) '
                  '| 0.250 (0.250) | 0.25 (0.33) | 1 |', out)
    self.assertIn('| conv1/bias:0 | additive_vector | 1.000 | 2.00 (2.00) '
                  '| 0.000 (0.000) | 0.00 (0.00) | 0 |', out)
    with open(output) as f:
      self.assertEqual(f.read(), out)

  def test_a_fixed_mask_is_expected_per_seed(self):
    # `fixed` freezes 2 of emnist_cnn's 4 kernels, a different 2 per seed; each
    # run's counts follow its own mask (2 clients), so observed = expected per
    # variable, and the expectation must average the two seeds' masks.
    types = [M, A] * 4
    masks = [schemes.MaskSampler(types, 'fixed', 0.5, seed=s).mask(0, 0) for s in (0, 1)]
    self.assertFalse(np.array_equal(masks[0], masks[1]))
    config = os.path.join(self.dir, 'fixed')
    for s, mask in enumerate(masks):
      counts = [int(2 * m) for m in mask]
      _write_run(os.path.join(config, f'seed_{s}'), [counts] * 3, pvt_scheme='fixed', seed=s)
    code, out, err = self._main(runs=[config], per_variable=True, output=None)
    self.assertEqual(code, 0, err)
    names = ['conv1/kernel:0', 'conv1/bias:0', 'conv2/kernel:0', 'conv2/bias:0',
             'dense1/kernel:0', 'dense1/bias:0', 'dense2/kernel:0', 'dense2/bias:0']
    for i in range(0, 8, 2):
      share = 1.0 - (masks[0][i] + masks[1][i]) / 2
      self.assertIn(f'| {names[i]} | multiplicative_matrix | {1 - share:.3f} '
                    f'| {2 * (1 - share):.2f} ({2 * (1 - share):.2f}) '
                    f'| {share:.3f} ({share:.3f}) |', out)

  def test_bad_input_is_one_line(self):
    fedavg = os.path.join(self.dir, 'fedavg')
    _write_run(fedavg, [[1] * 8], algorithm='fedavg')
    code, out, err = self._main(runs=[fedavg])
    self.assertEqual((code, out), (2, ''))
    self.assertEqual(err, f'error: --runs: {fedavg} is an --algorithm=fedavg run; this '
                     'reports --algorithm=pvt runs only\n')
    mixed = os.path.join(self.dir, 'mixed')
    _write_run(os.path.join(mixed, 'seed_0'), [[1] * 8])
    _write_run(os.path.join(mixed, 'seed_1'), [[1] * 8], clients_per_round=4)
    code, _, err = self._main(runs=[mixed])
    self.assertEqual(code, 2)
    self.assertIn('differ in --clients_per_round', err)
    self.assertEqual(err.count('\n'), 1)
    code, _, err = self._main(runs=[os.path.join(self.dir, 'missing')])
    self.assertEqual((code, err.strip()),
                     (2, f'error: --runs: {self.dir}/missing is not a directory'))
    broken = os.path.join(self.dir, 'broken')
    os.makedirs(broken)
    with open(os.path.join(broken, 'flags.json'), 'w') as f:
      f.write('["not", "flags"]')
    code, _, err = self._main(runs=[broken])
    self.assertEqual((code, err),
                     (2, f'error: --runs: {broken}/flags.json is not a JSON object of flags\n'))


if __name__ == '__main__':
  absltest.main()
