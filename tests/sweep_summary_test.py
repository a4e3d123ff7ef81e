"""Tests of `tff_partial.sweep.summary` on hand-made run outputs: the CPU path of each run.

No training: the runs' `final_eval.json`, `metrics.csv` and `flags.json` are
written by hand. The summary's statistics are checked against real runs in
sweep_test.py.
"""

import csv
import json
import os

from absl.testing import absltest

from tff_partial.sweep import driver
from tff_partial.sweep import plan
from tff_partial.sweep import spec as spec_lib

_PATH_A = 'CPU A; AVX-512 no; oneDNN off (TF_ENABLE_ONEDNN_OPTS=0)'
_PATH_B = 'CPU B; AVX-512 yes; oneDNN on (TF_ENABLE_ONEDNN_OPTS unset)'


def _write_run(sweep_dir, run, accuracy, cpu_path):
  directory = plan.run_dir(sweep_dir, run)
  os.makedirs(directory)
  with open(os.path.join(directory, 'metrics.csv'), 'w') as f:
    f.write('round_num,comm/bytes_down_per_client,comm/bytes_up_per_client,'
            'evaluation/accuracy,evaluation/loss\n'
            f'0,0,0,0.1,4.0\n1,100,50,{accuracy},1.0\n')
  flags = {'seed': run.seed}
  if cpu_path is not None:
    flags['cpu_path_resolved'] = cpu_path
  with open(os.path.join(directory, 'flags.json'), 'w') as f:
    json.dump(flags, f)
  with open(os.path.join(directory, plan.FINISHED_FILE), 'w') as f:
    json.dump({'accuracy': accuracy, 'loss': 1.0}, f)


class CpuPathTest(absltest.TestCase):

  def _summarize(self, paths):
    """Summary of 2 configs x 2 seeds whose runs started on `paths` (in plan order)."""
    spec = spec_lib.from_dict({
        'name': 'paths',
        'base': {'task': 'emnist_2nn', 'data_source': 'synthetic', 'total_rounds': 1},
        'configs': [{'name': 'a', 'flags': {'algorithm': 'fedavg'}},
                    {'name': 'b', 'flags': {'algorithm': 'fedavg', 'client_epochs': 2}}],
        'seeds': [0, 1]})
    sweep_dir = self.create_tempdir().full_path
    configs = spec.expand()
    runs = plan.plan_runs(spec, configs, default_total_rounds=1)
    self.assertEqual([r.run_id for r in runs],
                     ['runs/a/seed_0', 'runs/b/seed_0', 'runs/a/seed_1', 'runs/b/seed_1'])
    for run, path in zip(runs, paths):
      _write_run(sweep_dir, run, 0.5, path)
    prepared = driver.Prepared(spec, sweep_dir, configs, runs, resumed=False,
                               default_total_rounds=1)
    out = driver.summarize(prepared)
    with open(out['summary']) as f:
      markdown = f.read()
    with open(out['runs']) as f:
      rows = {row['run']: row for row in csv.DictReader(f)}
    return markdown, rows

  def test_one_path_is_recorded_and_no_note_is_written(self):
    markdown, rows = self._summarize([_PATH_A] * 4)
    self.assertEqual({row['cpu_path'] for row in rows.values()}, {_PATH_A})
    self.assertNotIn('more than one CPU path', markdown)

  def test_runs_from_two_paths_are_named_with_their_configs(self):
    markdown, rows = self._summarize([_PATH_A, _PATH_A, _PATH_B, None])
    self.assertEqual(rows['runs/a/seed_1']['cpu_path'], _PATH_B)
    self.assertEqual(rows['runs/b/seed_1']['cpu_path'], '')
    self.assertIn('**Runs from more than one CPU path.**', markdown)
    self.assertIn(f'- {_PATH_A}: 2 run(s) of `a`, `b`', markdown)
    self.assertIn(f'- {_PATH_B}: 1 run(s) of `a`', markdown)
    self.assertIn('- not recorded (a run from before the record): 1 run(s) of `b`', markdown)


if __name__ == '__main__':
  absltest.main()
