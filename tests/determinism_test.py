"""Same flags and seed, same result in any process, across kills and restarts.

Three runs of `scripts.train` in fresh processes: one uninterrupted, one
killed right after its round-2 checkpoint, one killed at another point (after
its round-3 metrics, mid-round 4, with no checkpoint of round 3). Each killed
run is restarted in a fresh process. All three must end with identical
weights and metrics.csv (wall-clock columns aside). CI runs this file under
both CPU paths (`TF_ENABLE_ONEDNN_OPTS=0` and `=1`, see the Makefile).
"""

import csv
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

from tests import testing_utils

_REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_TIME_COLUMNS = ('training_time_in_seconds', 'evaluation/evaluation_time_in_seconds')
_TIMEOUT_S = 900


def _rows(path):
  with open(path) as f:
    return [{k: v for k, v in r.items() if k not in _TIME_COLUMNS} for r in csv.DictReader(f)]


class KilledAndRestartedRunsTest(unittest.TestCase):

  def setUp(self):
    super().setUp()
    self.root = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.root, ignore_errors=True)

  def _start(self, name):
    flags = [
        '--task=emnist_2nn', '--algorithm=fedavg', '--data_source=leaf',
        f'--data_dir={testing_utils.shared_data(testing_utils.FEMNIST)}',
        f'--cache_dir={testing_utils.cache_dir()}',
        '--total_rounds=5', '--clients_per_round=3', '--client_max_batches=3',
        '--rounds_per_checkpoint=2', '--rounds_per_eval=5', '--seed=3',
        f'--root_output_dir={self.root}', f'--experiment_name={name}']
    # Its own process group: a kill takes TFF's worker with it.
    return subprocess.Popen(
        [sys.executable, '-m', 'scripts.train', *flags], cwd=_REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'), start_new_session=True)

  def _finish(self, process):
    _, err = process.communicate(timeout=_TIMEOUT_S)
    self.assertEqual(process.returncode, 0, err.decode()[-3000:])

  def _kill_each_when(self, *pending):
    """SIGKILLs each (process, condition) as soon as its condition holds.

    All are watched at once: a run waiting its turn could finish unseen.
    """
    pending = list(pending)
    deadline = time.monotonic() + _TIMEOUT_S
    while pending:
      for item in list(pending):
        process, condition = item
        if condition():
          os.killpg(process.pid, signal.SIGKILL)
          process.communicate()
          pending.remove(item)
        else:
          self.assertIsNone(process.poll(), 'the run ended before the kill point')
      self.assertLess(time.monotonic(), deadline)
      time.sleep(0.05)

  def _dir(self, name):
    return os.path.join(self.root, name)

  def _has_metrics_of_round(self, name, round_num):
    path = os.path.join(self._dir(name), 'metrics.csv')
    try:
      return any(r['round_num'] == str(round_num) for r in _rows(path))
    except (OSError, KeyError):
      return False

  def test_killed_and_restarted_runs_equal_an_uninterrupted_one(self):
    full = self._start('full')
    after_checkpoint = self._start('after_checkpoint')
    mid_round = self._start('mid_round')
    self._kill_each_when((after_checkpoint, lambda: os.path.isdir(
        os.path.join(self._dir('after_checkpoint'), 'checkpoints', 'program_state_2'))),
        (mid_round, lambda: self._has_metrics_of_round('mid_round', 3)))
    for name in ('after_checkpoint', 'mid_round'):
      self.assertFalse(os.path.exists(os.path.join(self._dir(name), 'final_eval.json')))
    restarted = [self._start('after_checkpoint'), self._start('mid_round')]
    for process in [full, *restarted]:
      self._finish(process)

    expected_weights = testing_utils.load_npz_weights(
        os.path.join(self._dir('full'), 'model_weights.npz'))
    expected_rows = _rows(os.path.join(self._dir('full'), 'metrics.csv'))
    self.assertEqual([r['round_num'] for r in expected_rows], ['0', '1', '2', '3', '4', '5'])
    for name in ('after_checkpoint', 'mid_round'):
      weights = testing_utils.load_npz_weights(
          os.path.join(self._dir(name), 'model_weights.npz'))
      self.assertEqual(len(weights), len(expected_weights))
      for a, b in zip(expected_weights, weights):
        np.testing.assert_array_equal(a, b, err_msg=name)
      self.assertEqual(_rows(os.path.join(self._dir(name), 'metrics.csv')), expected_rows, name)
      with open(os.path.join(self._dir(name), 'final_eval.json')) as f, open(
          os.path.join(self._dir('full'), 'final_eval.json')) as g:
        self.assertEqual(f.read(), g.read())


if __name__ == '__main__':
  unittest.main()
