"""Every committed sweep spec passes the sweep's checks; every summary reads back.

Specs: `experiments/sweeps/*.json`.
The result tables of docs/results/ each come from one of these specs, rerun
with one command; a spec that no longer parses, or whose flags scripts.train
now refuses, would only fail when someone reruns it. Checked here as
`scripts.sweep` checks before anything runs: the spec's structure, then every
config's (and search trial's) training argv with scripts.train's own flag
validation (`scripts.sweep_check`, in this process).

Summaries: `docs/results/**/runs.csv` with a `curves/` directory. Their
paired and window gaps are read by `scripts.sweep_compare` from
`curves/<config>_seed<s>.csv`; a curve named otherwise (configs renamed
since) would only fail when someone compares.
"""

import csv
import glob
import os
import shutil
import tempfile

from absl.testing import absltest

from scripts import sweep_check
from tff_partial import sweep
from tff_partial.sweep import compare
from tff_partial.sweep import summary

_REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


class CommittedSpecsTest(absltest.TestCase):

  def test_every_committed_spec_passes_the_sweeps_checks(self):
    paths = sorted(glob.glob(os.path.join(_REPO, 'experiments', 'sweeps', '*.json')))
    self.assertGreaterEqual(len(paths), 16)
    checked = []

    def check_fn(argvs):
      checked.extend(argvs)
      return sweep_check.check(argvs), 100

    train = sweep.TrainInterface(command=['unused'], check_fn=check_fn)
    for path in paths:
      name = os.path.splitext(os.path.basename(path))[0]
      with self.subTest(name):
        spec = sweep.from_dict(sweep.load_spec(path))
        self.assertEqual(spec.name, name)  # its default sweep dir is outputs/sweeps/<file name>
        sweep_dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, sweep_dir, ignore_errors=True)
        prepared = sweep.prepare(spec, sweep_dir, train)  # CheckError names the config
        self.assertNotEmpty(prepared.runs)
        self.assertEqual(os.listdir(sweep_dir), [])  # checking writes nothing
    self.assertGreaterEqual(len(checked), 2 * len(paths))

  def test_a_refused_flag_fails_the_check(self):
    # The check above can fail: scripts.train's validation rejects a bad value.
    spec = sweep.from_dict({'name': 'bad', 'base': {'task': 'emnist_cnn', 'total_rounds': 2},
                            'configs': [{'name': 'a', 'flags': {
                                'algorithm': 'select', 'select_layer': ['conv2'],
                                'select_keys': -3}}],
                            'seeds': [0]})
    train = sweep.TrainInterface(command=['unused'],
                                 check_fn=lambda argvs: (sweep_check.check(argvs), 100))
    with self.assertRaisesRegex(sweep.CheckError, 'config a: .*select_keys'):
      sweep.prepare(spec, self.create_tempdir().full_path, train)


class CommittedSummariesTest(absltest.TestCase):

  def test_every_summary_has_one_curve_per_run_ending_at_its_final_accuracy(self):
    paths = sorted(glob.glob(os.path.join(_REPO, 'docs', 'results', '**', 'runs.csv'),
                             recursive=True))
    summary_dirs = [os.path.dirname(p) for p in paths
                    if os.path.isdir(os.path.join(os.path.dirname(p), compare.CURVES_DIR))]
    self.assertGreaterEqual(len(summary_dirs), 60)
    for summary_dir in summary_dirs:
      with self.subTest(os.path.relpath(summary_dir, _REPO)):
        with open(os.path.join(summary_dir, 'runs.csv')) as f:
          runs = list(csv.DictReader(f))
        curves_dir = os.path.join(summary_dir, compare.CURVES_DIR)
        self.assertCountEqual(os.listdir(curves_dir),
                              [f'{r["config"]}_seed{r["seed"]}.csv' for r in runs])
        for config in sorted({r['config'] for r in runs}):
          finals = compare.read_arm(summary_dir, config)  # from runs.csv
          for seed, final in zip(finals.seeds, finals.values):
            curve = summary.read_metrics_csv(
                os.path.join(curves_dir, f'{config}_seed{seed}.csv'))
            self.assertEqual(100 * float(curve[-1]['evaluation/accuracy']), final)


if __name__ == '__main__':
  absltest.main()
