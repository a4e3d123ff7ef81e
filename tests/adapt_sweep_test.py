"""Tests of scripts.adapt_sweep and tff_partial.adaptation.over_seeds."""

import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import tensorflow as tf

from tasks import emnist
from tff_partial.adaptation import over_seeds

# The source tree (as tests/sweep_test.py): under Bazel, realpath leaves the runfiles.
_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def _summary(federated, local, best, below_local, helped, unchanged, n=10):
  share = lambda x: {'count': round(x * n), 'share': x}
  return {
      'num_participants': n,
      'accuracy': {'federated': {'mean': federated}, 'local': {'mean': local},
                   'best_adapted': {'mean': best}},
      'federated_below_local': share(below_local),
      'adapted_below_local': {'best_adapted': share(0.0)},
      'adapted_vs_federated': {'best_adapted': {
          'helped': share(helped), 'unchanged': share(unchanged),
          'hurt': share(1 - helped - unchanged)}},
  }


class OverSeedsTest(tf.test.TestCase):

  def test_mean_and_sample_std_over_seeds(self):
    by_config = {'fedavg': [_summary(0.7, 0.5, 0.8, 0.1, 0.6, 0.3),
                            _summary(0.6, 0.5, 0.7, 0.3, 0.8, 0.1)],
                 'median': [_summary(0.5, 0.5, 0.6, 0.4, 0.9, 0.1)]}
    rows = over_seeds.rows(by_config)
    self.assertEqual([r['config'] for r in rows], ['fedavg', 'median'])
    self.assertEqual(rows[0]['seeds'], 2)
    self.assertAlmostEqual(rows[0]['federated_mean'], 0.65)
    self.assertAlmostEqual(rows[0]['federated_std'], np.std([0.7, 0.6], ddof=1))
    self.assertAlmostEqual(rows[0]['helped_mean'], 0.7)
    self.assertAlmostEqual(rows[0]['hurt_mean'], 0.1)
    self.assertAlmostEqual(rows[0]['federated_below_local_std'], np.std([0.1, 0.3], ddof=1))
    self.assertTrue(np.isnan(rows[1]['federated_std']))  # one seed: no spread
    table = over_seeds.markdown(by_config)
    self.assertIn('| fedavg | 2 | 10 | 65.0 ± 7.1 | 50.0 ± 0.0 | 75.0 ± 7.1 | 20.0 ± 14.1 '
                  '| 0.0 ± 0.0 | 70.0 ± 14.1 / 20.0 ± 14.1 / 10.0 ± 0.0 |', table)
    self.assertIn('| median | 1 | 10 | 50.0 | 50.0 | 60.0 |', table)
    with self.assertRaisesRegex(ValueError, 'no adaptation summaries'):
      over_seeds.summarize_config([])


def _write_run(sweep_dir, config, seed, finished=True):
  """A fake finished scripts.train run on synthetic EMNIST."""
  run_dir = os.path.join(sweep_dir, 'runs', config, f'seed_{seed}')
  os.makedirs(run_dir)
  tf.keras.utils.set_random_seed(seed + (10 if config == 'b' else 0))
  np.savez(os.path.join(run_dir, 'model_weights.npz'), *emnist.create_cnn().get_weights())
  with open(os.path.join(run_dir, 'flags.json'), 'w') as f:
    json.dump({'task': 'emnist_cnn', 'data_source': 'synthetic', 'data_dir': None,
               'algorithm': 'fedavg', 'aggregator': 'mean', 'seed': seed}, f)
  if finished:
    with open(os.path.join(run_dir, 'final_eval.json'), 'w') as f:
      json.dump({}, f)


def _adapt_sweep(*args):
  return subprocess.run(
      [sys.executable, '-m', 'scripts.adapt_sweep', *args], cwd=_ROOT,
      capture_output=True, text=True, timeout=900)


def _csv(path):
  with open(path) as f:
    return list(csv.DictReader(f))


class AdaptSweepMainTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

  def test_adapts_finished_runs_reuses_local_models_and_resumes(self):
    for config, seed in (('a', 0), ('a', 1), ('b', 0)):
      _write_run(self.dir, config, seed)
    _write_run(self.dir, 'b', 1, finished=False)  # still training: not adapted
    training_running = {'runs/b/seed_1': 4242}  # the training sweep's, beside it
    with open(os.path.join(self.dir, 'running.json'), 'w') as f:
      json.dump(training_running, f)
    sets = ['--set=num_participants=2', '--set=local_epochs=1', '--set=adapt_epochs=1',
            '--set=adapt_batch_size=4', '--set=fisher_max_examples=3',
            '--set=strategies=finetune,ewc']
    result = _adapt_sweep(f'--sweep_dir={self.dir}', '--parallel=2', *sets)
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    with open(os.path.join(self.dir, 'running.json')) as f:
      self.assertEqual(json.load(f), training_running)  # not overwritten
    with open(os.path.join(self.dir, 'running_adaptation.json')) as f:  # its own
      self.assertEqual(json.load(f), {})
    adapted = os.path.join(self.dir, 'adaptation')
    self.assertCountEqual(os.listdir(adapted), ['a', 'b'])
    self.assertEqual(os.listdir(os.path.join(adapted, 'b')), ['seed_0'])
    # b's seed-0 adaptation reused a's seed-0 local models (same data).
    with open(os.path.join(adapted, 'b', 'seed_0', 'summary.json')) as f:
      b0 = json.load(f)
    self.assertEqual(b0['config']['reuse_local_from'],
                     os.path.join(adapted, 'a', 'seed_0', 'participants.csv'))
    a0_rows = _csv(os.path.join(adapted, 'a', 'seed_0', 'participants.csv'))
    b0_rows = _csv(os.path.join(adapted, 'b', 'seed_0', 'participants.csv'))
    self.assertEqual([r['local'] for r in a0_rows], [r['local'] for r in b0_rows])
    # The summary over seeds, checked against the runs' own summaries.
    summaries = []
    for seed in (0, 1):
      with open(os.path.join(adapted, 'a', f'seed_{seed}', 'summary.json')) as f:
        summaries.append(json.load(f))
    self.assertIsNone(summaries[1]['config']['reuse_local_from'])
    rows = {r['config']: r for r in _csv(os.path.join(self.dir, 'summary', 'adaptation.csv'))}
    self.assertEqual((rows['a']['seeds'], rows['b']['seeds']), ('2', '1'))
    federated = [s['accuracy']['federated']['mean'] for s in summaries]
    self.assertAlmostEqual(float(rows['a']['federated_mean']), np.mean(federated), places=6)
    self.assertAlmostEqual(float(rows['a']['federated_std']), np.std(federated, ddof=1), places=6)
    # A rerun skips the three finished adaptations.
    again = _adapt_sweep(f'--sweep_dir={self.dir}', *sets)
    self.assertEqual(again.returncode, 0, again.stderr[-3000:])
    self.assertIn('3 of 3 runs already finished', again.stdout)

  def test_bad_input_one_line_before_anything_runs(self):
    _write_run(self.dir, 'a', 0)
    for args, message in (
        (['--set=magic=1'], 'scripts.adapt has no flag --magic'),
        (['--set=run_dir=x'], 'sets --run_dir itself'),
        (['--set=num_participants'], 'expected flag=value'),
        (['--only=zzz'], 'no finished runs matching --only=zzz'),
    ):
      result = _adapt_sweep(f'--sweep_dir={self.dir}', *args)
      self.assertEqual(result.returncode, 2, args)
      self.assertIn(message, result.stderr.strip().splitlines()[-1])
    result = _adapt_sweep(f'--sweep_dir={os.path.join(self.dir, "nope")}')
    self.assertEqual(result.returncode, 2)
    self.assertIn('is not a scripts.sweep directory', result.stderr)
    self.assertFalse(os.path.exists(os.path.join(self.dir, 'adaptation')))


class PlanTest(tf.test.TestCase):

  def test_a_run_adapted_as_leader_stays_the_leader(self):
    # Seen on the CIFAR sweep: fedavg/seed_0 was adapted first (it trained the
    # local models); once dp_fedavg/seed_0 finished, it sorted first, became
    # the leader, and fedavg/seed_0's argv changed, so it was adapted again.
    from scripts import adapt_sweep  # pylint: disable=g-import-not-at-top
    root = self.create_tempdir().full_path
    saved = {'task': 'emnist_2nn', 'data_source': 'synthetic', 'seed': 0}
    runs = [(c, 0, os.path.join(root, 'runs', c, 'seed_0'), saved) for c in ('dp', 'fedavg')]
    before, argvs, _ = adapt_sweep.plan_adaptations(root, runs[1:], {}, True)
    out = adapt_sweep.results_dir(root, 'fedavg', 0)
    os.makedirs(out)
    with open(os.path.join(out, adapt_sweep._ARGV_FILE), 'w') as f:
      json.dump(argvs[before[0].run_id][1:], f)
    with open(os.path.join(out, 'summary.json'), 'w') as f:
      f.write('{}')
    jobs, argvs, deps = adapt_sweep.plan_adaptations(root, runs, {}, True)
    self.assertEqual([j.run_id for j in jobs], ['adaptation/fedavg/seed_0', 'adaptation/dp/seed_0'])
    self.assertEqual(argvs['adaptation/fedavg/seed_0'], argvs[before[0].run_id])
    self.assertTrue(adapt_sweep.is_adapted(root, jobs[0], argvs[jobs[0].run_id]))
    self.assertIn(f'--reuse_local_from={os.path.join(out, "participants.csv")}',
                  argvs['adaptation/dp/seed_0'])
    self.assertEqual(deps['adaptation/dp/seed_0'], ['adaptation/fedavg/seed_0'])
    # dp/seed_0 was started once as the leader (no reuse) and stopped: its
    # partial results are stale (scripts.adapt refuses to resume them with the
    # new argv); finished ones and ones with the same argv are not.
    dp_out = adapt_sweep.results_dir(root, 'dp', 0)
    os.makedirs(dp_out)
    with open(os.path.join(dp_out, adapt_sweep._ARGV_FILE), 'w') as f:
      json.dump([a for a in argvs['adaptation/dp/seed_0'][1:]
                 if not a.startswith('--reuse_local_from=')], f)
    self.assertTrue(adapt_sweep.stale_partial(dp_out, argvs['adaptation/dp/seed_0']))
    self.assertFalse(adapt_sweep.stale_partial(out, argvs['adaptation/dp/seed_0']))  # finished
    self.assertFalse(adapt_sweep.stale_partial(out, argvs['adaptation/fedavg/seed_0']))


if __name__ == '__main__':
  tf.test.main()
