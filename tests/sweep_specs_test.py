"""Every committed sweep spec (`experiments/sweeps/*.json`) passes the sweep's checks.

The result tables of docs/results/ each come from one of these specs, rerun
with one command; a spec that no longer parses, or whose flags scripts.train
now refuses, would only fail when someone reruns it. Checked here as
`scripts.sweep` checks before anything runs: the spec's structure, then every
config's (and search trial's) training argv with scripts.train's own flag
validation (`scripts.sweep_check`, in this process).
"""

import glob
import os
import shutil
import tempfile

from absl.testing import absltest

from scripts import sweep_check
from tff_partial import sweep

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


if __name__ == '__main__':
  absltest.main()
