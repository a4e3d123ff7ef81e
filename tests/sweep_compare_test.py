"""Tests of `tff_partial.sweep.compare` and `scripts.sweep_compare` on hand-made summaries.

Every expected number is worked out by hand in the comments.
"""

import os
import subprocess
import sys

from absl.testing import absltest
import numpy as np

from tests import testing_utils
from tff_partial.sweep import compare
from tff_partial.sweep import manifest
from tff_partial.sweep import spec as spec_lib

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Final test accuracy per seed, and the evaluations of rounds 1-4 (round 4 is the end).
_BASE = {'fedavg': {0: (0.40, [0.10, 0.20, 0.30, 0.40]), 1: (0.44, [0.12, 0.24, 0.36, 0.44]),
                    2: (0.42, [0.14, 0.28, 0.32, 0.42])},
         'pvt': {0: (0.30, [0.10, 0.20, 0.25, 0.30]), 1: (0.32, [0.10, 0.20, 0.28, 0.32]),
                 2: (0.34, [0.10, 0.20, 0.30, 0.34])}}
_MORE = {'fedavg': {0: (0.50, [0.2, 0.3, 0.4, 0.50]), 1: (0.50, [0.2, 0.3, 0.4, 0.50])},
         'pvt': {0: (0.40, [0.2, 0.3, 0.4, 0.40]), 1: (0.44, [0.2, 0.3, 0.4, 0.44])}}


def _write_summary(directory, arms):
  os.makedirs(os.path.join(directory, 'curves'))
  with open(os.path.join(directory, 'runs.csv'), 'w') as f:
    f.write('run,config,seed,test_accuracy,test_loss\n')
    for config, seeds in arms.items():
      for seed, (final, curve) in seeds.items():
        f.write(f'runs/{config}/seed_{seed},{config},{seed},{final},1.0\n')
        with open(os.path.join(directory, 'curves', f'{config}_seed{seed}.csv'), 'w') as c:
          c.write('round_num,evaluation/accuracy,evaluation/loss\n0,0.01,4.0\n')
          for k, value in enumerate(curve, start=1):
            # Round 3 first logged with another value, then again (below).
            c.write(f'{k},{0.99 if k == 3 else value},1.0\n')
          c.write('5,,\n')  # a round without an evaluation
          # Round 3 logged again by a run resumed from its round-2 checkpoint: it counts once.
          c.write(f'3,{curve[2]},1.0\n')


class CompareTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    root = self.create_tempdir().full_path
    self.base, self.more = os.path.join(root, 'base'), os.path.join(root, 'more')
    _write_summary(self.base, _BASE)
    _write_summary(self.more, _MORE)

  def test_arms_gaps_and_changes(self):
    fedavg = compare.read_arm(self.base, 'fedavg')
    self.assertEqual(fedavg.seeds, (0, 1, 2))
    self.assertAlmostEqual(fedavg.mean, 42.0)  # (40 + 44 + 42) / 3
    self.assertAlmostEqual(fedavg.std, 2.0)  # sqrt((4 + 4 + 0) / 2)
    pvt = compare.read_arm(self.base, 'pvt')
    self.assertAlmostEqual(pvt.mean, 32.0)
    self.assertAlmostEqual(pvt.std, 2.0)
    g = compare.gap(pvt, fedavg)
    self.assertAlmostEqual(g.mean, -10.0)
    self.assertAlmostEqual(g.se, (4 / 3 + 4 / 3) ** 0.5)  # 1.633
    self.assertEqual(g.text(), '-10.00 (s.e. 1.63)')

    # Rounds 3-4: fedavg per seed (30+40)/2 = 35, (36+44)/2 = 40, (32+42)/2 = 37.
    window = compare.read_arm(self.base, 'fedavg', window=(3, 4))
    self.assertSequenceAlmostEqual(list(window.values), [35.0, 40.0, 37.0])
    # Rounds 4-5: round 5 has no evaluation, so only round 4 counts.
    self.assertSequenceAlmostEqual(
        list(compare.read_arm(self.base, 'pvt', window=(4, 5)).values), [30.0, 32.0, 34.0])

    # The 2-seed sweep: fedavg 50 ± 0, pvt 42 ± 2.83; gap -8, s.e. sqrt(0 + 8 / 2) = 2.
    more_gap = compare.gap(compare.read_arm(self.more, 'pvt'),
                           compare.read_arm(self.more, 'fedavg'))
    self.assertAlmostEqual(more_gap.mean, -8.0)
    self.assertAlmostEqual(more_gap.se, 2.0)
    c = compare.change(g, more_gap)  # -8 - (-10) = +2, s.e. sqrt(8/3 + 4)
    self.assertAlmostEqual(c.mean, 2.0)
    self.assertAlmostEqual(c.se, (8 / 3 + 4) ** 0.5)

  def test_table(self):
    lines = compare.table([('base', self.base), ('more', self.more)], 'fedavg', ['pvt'],
                          window=(3, 4))
    self.assertEqual(lines[0], '| arm | base, final | more, final | base, rounds 3-4 | '
                               'more, rounds 3-4 |')
    self.assertEqual(lines[2], '| fedavg (2/3 seeds) | 42.00 ± 2.00 | 50.00 ± 0.00 | '
                               '37.33 ± 2.52 | 45.00 ± 0.00 |')
    # pvt rounds 3-4: base 27.5 / 30 / 32 (mean 29.83), more 40 / 42 (mean 41).
    self.assertEqual(lines[3], '| pvt (2/3 seeds) | 32.00 ± 2.00 | 42.00 ± 2.83 | '
                               '29.83 ± 2.25 | 41.00 ± 1.41 |')
    self.assertTrue(lines[4].startswith('| gap pvt - fedavg | -10.00 (s.e. 1.63) | '
                                        '-8.00 (s.e. 2.00) | -7.50 (s.e. '))
    self.assertEqual(lines[6], '- more against base, final: fedavg +8.00 (s.e. 1.15); '
                               'pvt +10.00 (s.e. 2.31); gap of pvt +2.00 (s.e. 2.58)')

  def test_paired_by_seed(self):
    # Final accuracy, base: pvt - fedavg per seed 30-40, 32-44, 34-42 = -10, -12, -8;
    # mean -10, std 2, s.e. 2 / sqrt(3) = 1.15.
    lines = compare.table([('base', self.base)], 'fedavg', ['pvt'], paired_seeds=True)
    self.assertEqual(lines[-2:], ['', '- paired by seed, base, final, gap to fedavg: pvt '
                                  '-10.00 / -12.00 / -8.00 (seeds 0/1/2: -10.00 (s.e. 1.15), '
                                  '3 below, 0 above)'])
    # Only the seeds both arms ran are paired: seeds 1 and 3 here, +1 and -2.
    arm = compare.Arm('a', (0, 1, 3), np.array([5.0, 6.0, 7.0]))
    reference = compare.Arm('r', (1, 2, 3), np.array([5.0, 1.0, 9.0]))
    diffs = compare.paired(arm, reference)
    self.assertEqual(diffs.seeds, (1, 3))
    self.assertSequenceAlmostEqual(list(diffs.values), [1.0, -2.0])
    # Arms that share no seed cannot be paired, and the table says so.
    apart = os.path.join(self.create_tempdir().full_path, 'apart')
    _write_summary(apart, {'fedavg': {0: _BASE['fedavg'][0]}, 'pvt': {1: _BASE['pvt'][1]}})
    with self.assertRaisesRegex(compare.CompareError, 'pvt and fedavg share no seed'):
      compare.table([('x', apart)], 'fedavg', ['pvt'], paired_seeds=True)

  def test_missing_config_names_the_configs(self):
    with self.assertRaisesRegex(compare.CompareError, "no finished run of config 'select'; "
                                'its configs: fedavg, pvt'):
      compare.read_arm(self.base, 'select')
    with self.assertRaisesRegex(compare.CompareError, 'no evaluation in rounds 7-9'):
      compare.read_arm(self.base, 'pvt', window=(7, 9))

  def test_loss_across_groups_of_one_sweep_named_by_suffix(self):
    # One sweep, two noise levels carried in the config names: final test loss per seed.
    directory = os.path.join(self.create_tempdir().full_path, 'dp')
    os.makedirs(os.path.join(directory, 'curves'))
    losses = {'fedavg_z0': [4.6, 4.7], 'fedpt_z0': [4.9, 4.9],
              'fedavg_z1': [5.0, 5.1], 'fedpt_z1': [5.0, 5.0]}
    with open(os.path.join(directory, 'runs.csv'), 'w') as f:
      f.write('run,config,seed,test_loss,test_accuracy\n')
      for config, values in losses.items():
        for seed, value in enumerate(values):
          f.write(f'runs/{config}/seed_{seed},{config},{seed},{value},0.01\n')
          with open(os.path.join(directory, 'curves', f'{config}_seed{seed}.csv'), 'w') as c:
            # Rounds 1-2 of the window: value + 0.2 and value; per seed value + 0.1.
            c.write('round_num,evaluation/accuracy,evaluation/loss\n'
                    f'1,0.01,{value + 0.2}\n2,0.01,{value}\n')
    lines = compare.table([('z0', directory), ('z1', directory)], 'fedavg', ['fedpt'],
                          window=(1, 2), metric='loss', suffixes={'z0': '_z0', 'z1': '_z1'})
    # fedavg z0: 4.65 ± 0.0707; fedpt z0: 4.9 ± 0; fedavg z1: 5.05 ± 0.0707; fedpt z1: 5.0.
    self.assertEqual(lines[2], '| fedavg (2 seeds) | 4.650 ± 0.071 | 5.050 ± 0.071 | '
                               '4.750 ± 0.071 | 5.150 ± 0.071 |')
    # Gaps: z0 +0.25, z1 -0.05, each with s.e. sqrt(0.005 / 2 + 0) = 0.05.
    self.assertEqual(lines[4], '| gap fedpt - fedavg | +0.250 (s.e. 0.050) | '
                               '-0.050 (s.e. 0.050) | +0.250 (s.e. 0.050) | '
                               '-0.050 (s.e. 0.050) |')
    # The gap's change z0 -> z1: -0.30, s.e. sqrt(0.05^2 + 0.05^2) = 0.0707.
    self.assertIn('gap of fedpt -0.300 (s.e. 0.071)', lines[6])
    with self.assertRaisesRegex(compare.CompareError, 'suffixes name labels that no sweep '
                                'has: z3'):
      compare.table([('z0', directory)], 'fedavg', ['fedpt'], suffixes={'z3': '_z3'})
    with self.assertRaisesRegex(compare.CompareError, "metric 'bleu' is not one of"):
      compare.read_arm(directory, 'fedavg_z0', metric='bleu')
    # The old summaries of this test's setUp log a loss of 1.0: an arm reads it in nats.
    self.assertAlmostEqual(compare.read_arm(self.base, 'pvt', metric='loss').mean, 1.0)

  def test_a_summary_without_the_metric_says_how_to_rewrite_it(self):
    directory = os.path.join(self.create_tempdir().full_path, 'old')
    os.makedirs(directory)
    with open(os.path.join(directory, 'runs.csv'), 'w') as f:
      f.write('run,config,seed,test_loss\nruns/a/seed_0,a,0,4.0\n')
    with self.assertRaisesRegex(compare.CompareError, r'has no test_accuracy for every run of '
                                r"'a' \(rewrite the summary with scripts.sweep --summary_only\)"):
      compare.read_arm(directory, 'a')

  def _write_running_sweep(self):
    """A sweep directory mid-run: runs' own metrics.csv, one run ahead, none finished."""
    directory = os.path.join(self.create_tempdir().full_path, 'sweep')
    # Evaluations every 2 rounds; seed 1 of fedavg has reached round 8, the others round 6.
    curves = {'fedavg': {0: [0.30, 0.40, 0.50], 1: [0.34, 0.42, 0.46, 0.60]},
              'fedpt': {0: [0.20, 0.30, 0.35], 1: [0.22, 0.36, 0.41]}}
    for config, seeds in curves.items():
      for seed, curve in seeds.items():
        run_dir = os.path.join(directory, 'runs', config, f'seed_{seed}')
        os.makedirs(run_dir)
        with open(os.path.join(run_dir, 'metrics.csv'), 'w') as f:
          f.write('round_num,evaluation/accuracy,evaluation/loss\n0,0.1,2.3\n')
          for k, value in enumerate(curve, start=1):
            f.write(f'{2 * k - 1},,\n{2 * k},{value},1.0\n')
          # Round 4 retrained after a resume from the round-3 checkpoint: the last row counts.
          f.write(f'4,{curve[1]},1.0\n')
    # A finished run's directory is read the same way; a stray directory is ignored.
    os.makedirs(os.path.join(directory, 'runs', 'fedpt', 'search_notes'))
    return directory

  def test_running_sweep_windows(self):
    directory = self._write_running_sweep()
    # Rounds 3-6: fedavg seed 0 (40 + 50) / 2 = 45, seed 1 (42 + 46) / 2 = 44: 44.5 ± 0.71;
    # fedpt seed 0 32.5, seed 1 38.5: 35.5 ± 4.24; gap -9.0, s.e. sqrt(0.5/2 + 18/2) = 3.04.
    fedavg, reached = compare.read_running_arm(directory, 'fedavg', (3, 6))
    self.assertEqual(fedavg.seeds, (0, 1))
    self.assertSequenceAlmostEqual(list(fedavg.values), [45.0, 44.0])
    self.assertEqual(reached, 6)  # the least last round of its runs
    lines = compare.table([('now', directory)], 'fedavg', ['fedpt'], window=(3, 6),
                          running=True)
    self.assertEqual(lines, [
        '| arm | now, rounds 3-6 |', '|---|---|',
        '| fedavg (2 seeds) | 44.50 ± 0.71 |', '| fedpt (2 seeds) | 35.50 ± 4.24 |',
        '| gap fedpt - fedavg | -9.00 (s.e. 3.04) |', '',
        'Running: every run compared has logged round 6 (now) or later.'])
    with self.assertRaisesRegex(compare.CompareError, r'seed_0/metrics.csv has reached round 6, '
                                r'before the end of window 5-8: pick a window that ends by '
                                r'round 6, or wait'):
      compare.read_running_arm(directory, 'fedavg', (5, 8))
    with self.assertRaisesRegex(compare.CompareError, 'give a window'):
      compare.table([('now', directory)], 'fedavg', ['fedpt'], running=True)
    # A summary directory is not a sweep directory, and the error says so.
    with self.assertRaisesRegex(compare.CompareError, r"no run of config 'fedavg' with a "
                                r'metrics.csv; its configs: none \(--running reads a sweep '
                                r'directory, not a summary\)'):
      compare.read_running_arm(self.base, 'fedavg', (3, 4))

  def test_running_sweep_reads_the_seeds_of_its_manifest(self):
    directory = self._write_running_sweep()
    # A run of a seed outside the spec (left from another sweep) is not read.
    stray = os.path.join(directory, 'runs', 'fedavg', 'seed_7')
    os.makedirs(stray)
    with open(os.path.join(stray, 'metrics.csv'), 'w') as f:
      f.write('round_num,evaluation/accuracy,evaluation/loss\n0,0.1,2.3\n6,0.99,1.0\n')
    def spec(seeds):
      return spec_lib.from_dict({'name': 'running', 'base': {'task': 'emnist_2nn'},
                                 'configs': [{'name': 'fedavg'}, {'name': 'fedpt'}],
                                 'seeds': seeds})
    manifest.write(directory, spec([0, 1]), 10)
    fedavg, _ = compare.read_running_arm(directory, 'fedavg', (3, 6))
    self.assertEqual(fedavg.seeds, (0, 1))
    self.assertSequenceAlmostEqual(list(fedavg.values), [45.0, 44.0])
    with self.assertRaisesRegex(compare.CompareError, r"has no config 'select'; its configs: "
                                r'fedavg, fedpt$'):
      compare.read_running_arm(directory, 'select', (3, 6))
    # A seed of the spec that has not started stops the comparison (not an arm of 2 seeds).
    os.remove(os.path.join(directory, manifest.MANIFEST_FILE))
    manifest.write(directory, spec([0, 1, 2]), 10)
    with self.assertRaisesRegex(compare.CompareError, r"config 'fedavg' has no metrics.csv for "
                                r'seed\(s\) 2 of its sweep \(seeds 0, 1, 2\): compare once '
                                r'every seed has started$'):
      compare.table([('now', directory)], 'fedavg', ['fedpt'], window=(3, 6), running=True)

  def test_binary(self):
    def run(*args):
      return subprocess.run([sys.executable, '-m', 'scripts.sweep_compare', *args], cwd=_REPO,
                            capture_output=True, text=True, check=False)

    output = os.path.join(self.create_tempdir().full_path, 'compare.md')
    result = run(f'--sweeps=base={self.base},more={self.more}', '--configs=pvt',
                 '--window=3,4', f'--output={output}')
    self.assertEqual(result.returncode, 0, result.stderr)
    with open(output) as f:
      self.assertEqual(f.read(), result.stdout)
    self.assertIn('gap of pvt +2.00 (s.e. 2.58)', result.stdout)
    result = run(f'--sweeps=base={self.base}', '--configs=pvt', '--metric=loss')
    self.assertEqual(result.returncode, 0, result.stderr)
    self.assertIn('| gap pvt - fedavg | +0.000 (s.e. 0.000) |', result.stdout)
    for args, error in [
        ((f'--sweeps=base={self.base}', '--configs=dense'),
         "error: {} has no finished run of config 'dense'; its configs: fedavg, pvt"
         .format(self.base)),
        ((f'--sweeps={self.base}', '--configs=pvt'),
         f"error: --sweeps item '{self.base}' must be label=summary_dir"),
        ((f'--sweeps=a={self.base}', '--configs=pvt', '--window=4,3'),
         'error: --window=4,3 must have 0 <= first <= last'),
        ((f'--sweeps=a={self.base}', '--configs=pvt', '--suffixes=b=_z1'),
         "error: --suffixes names 'b', which is no --sweeps label (a)"),
        ((f'--sweeps=a={self.base}', '--configs=pvt', '--suffixes=a'),
         "error: --suffixes item 'a' must be label=suffix")]:
      result = run(*args)
      self.assertEqual(result.returncode, 2, result.stderr)
      self.assertEqual(testing_utils.own_stderr_lines(result.stderr), [error])
    sweep = self._write_running_sweep()
    result = run(f'--sweeps=now={sweep}', '--configs=fedpt', '--running', '--window=3,6')
    self.assertEqual(result.returncode, 0, result.stderr)
    self.assertIn('| gap fedpt - fedavg | -9.00 (s.e. 3.04) |', result.stdout)
    # Paired: fedpt - fedavg per seed 32.5 - 45 = -12.5 and 38.5 - 44 = -5.5; mean -9.0,
    # std 7 / sqrt(2) = 4.95, s.e. 4.95 / sqrt(2) = 3.50.
    result = run(f'--sweeps=now={sweep}', '--configs=fedpt', '--running', '--window=3,6',
                 '--paired')
    self.assertEqual(result.returncode, 0, result.stderr)
    self.assertIn('- paired by seed, now, rounds 3-6, gap to fedavg: fedpt -12.50 / -5.50 '
                  '(seeds 0/1: -9.00 (s.e. 3.50), 2 below, 0 above)\n', result.stdout)
    result = run(f'--sweeps=now={sweep}', '--configs=fedpt', '--running')
    self.assertEqual(result.returncode, 2, result.stderr)
    self.assertEqual(testing_utils.own_stderr_lines(result.stderr), [
        'error: --running compares rounds of unfinished runs: give --window=first,last'])


if __name__ == '__main__':
  absltest.main()
