"""End-to-end tests of `scripts.sweep` with real `scripts.train` runs on synthetic data.

A 2 x 2 grid (client x server learning rate) x 2 seeds of 2-round runs, run
once uninterrupted and once killed mid-sweep and rerun; a learning-rate
search; and bad input, which must stop before anything runs.
"""
# bazel: size=large
# bazel: deps=//scripts:sweep,//scripts:train

import csv
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from absl.testing import absltest
import numpy as np

from scripts import sweep_check
from tests import testing_utils
from tff_partial import sweep
from tff_partial.sweep import manifest
from tff_partial.sweep import plan
from tff_partial.training import resumable

_REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_BASE = {'task': 'emnist_2nn', 'data_source': 'synthetic', 'total_rounds': 2,
         'clients_per_round': 1, 'client_max_batches': 1, 'rounds_per_checkpoint': 1}
_GRID_SPEC = {
    'name': 'tiny_grid',
    'base': _BASE,
    'grid': {'client_learning_rate': [0.05, 0.1], 'server_learning_rate': [0.5, 1.0]},
    'seeds': [0, 1],
}
# emnist_2nn: 209,662 float32 parameters down and up per round.
_BYTES_PER_ROUND = 2 * 4 * 209_662
_TIME_COLUMNS = ('training_time_in_seconds', 'evaluation/evaluation_time_in_seconds')
# Student's t quantile t(0.975, 1 degree of freedom) (two seeds).
_T_975_1 = 12.706204736174707


# Runs are bit-identical across processes (--deterministic, on by default:
# docs/architecture.md), so a killed-and-resumed sweep must equal an
# uninterrupted one exactly.
_RTOL = 0.0


def _assert_rows_close(test, rows_a, rows_b, where):
  """Same rows and keys; numbers equal up to _RTOL, everything else exactly."""
  test.assertEqual([sorted(r) for r in rows_a], [sorted(r) for r in rows_b], where)
  for a, b in zip(rows_a, rows_b):
    for key in a:
      try:
        x, y = float(a[key]), float(b[key])
      except (TypeError, ValueError):
        test.assertEqual(a[key], b[key], f'{where}: {key}')
        continue
      if not (math.isnan(x) and math.isnan(y)):
        test.assertLessEqual(abs(x - y), _RTOL * max(abs(x), abs(y), 1.0), f'{where}: {key}')


def _write_spec(directory, data):
  path = os.path.join(directory, f'{data["name"]}.json')
  with open(path, 'w') as f:
    json.dump(data, f)
  return path


def _sweep_command(spec_path, sweep_dir, *extra):
  return [sys.executable, '-m', 'scripts.sweep', f'--spec={spec_path}',
          f'--sweep_dir={sweep_dir}', '--parallel=2', *extra]


def _env():
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')


def _run_sweep(spec_path, sweep_dir, *extra):
  result = subprocess.run(_sweep_command(spec_path, sweep_dir, *extra), cwd=_REPO, env=_env(),
                          capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stdout + result.stderr
  return result.stdout


def _csv_rows(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def _metrics(run_dir):
  return [{k: v for k, v in row.items() if k not in _TIME_COLUMNS}
          for row in _csv_rows(os.path.join(run_dir, 'metrics.csv'))]


def _final_runs(sweep_dir):
  root = os.path.join(sweep_dir, plan.RUNS_DIR)
  return sorted(os.path.join(plan.RUNS_DIR, config, seed)
                for config in os.listdir(root) for seed in os.listdir(os.path.join(root, config)))


def _finished(sweep_dir):
  return {r for r in _final_runs(sweep_dir)
          if os.path.exists(os.path.join(sweep_dir, r, plan.FINISHED_FILE))}


def _has_checkpoint(sweep_dir, run):
  """The run saved a whole checkpoint of a trained round (past round 0, the
  initial state); TFF writes `program_state_N_temp...`, then renames."""
  checkpoint = resumable.latest_checkpoint(os.path.join(sweep_dir, run))
  return checkpoint is not None and resumable.checkpoint_round(checkpoint) > 0


def _unfinished_with_checkpoint(sweep_dir, runs):
  return [r for r in runs if _has_checkpoint(sweep_dir, r)
          and not os.path.exists(os.path.join(sweep_dir, r, plan.FINISHED_FILE))]


def _signal_groups(pgids, signum):
  for pgid in pgids:
    try:
      os.killpg(pgid, signum)
    except ProcessLookupError:  # the run ended since running.json was read
      pass


def _processes_in_group(pgid):
  found = []
  for entry in os.listdir('/proc'):
    if entry.isdigit():
      try:
        with open(f'/proc/{entry}/stat') as f:
          fields = f.read().rsplit(')', 1)[1].split()
      except OSError:
        continue
      if int(fields[2]) == pgid and fields[0] != 'Z':
        found.append(int(entry))
  return found


class SweepGridTest(absltest.TestCase):
  """The 2 x 2 grid x 2 seeds sweep: uninterrupted (A), killed then rerun (B), and
  from B's bank in a new directory (C)."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp(prefix='sweep_test_')
    cls.spec_path = _write_spec(cls.root, _GRID_SPEC)
    cls.full = os.path.join(cls.root, 'full')
    cls.killed = os.path.join(cls.root, 'killed')
    _run_sweep(cls.spec_path, cls.full)

    # B: killed (SIGTERM to its process group, as a terminal's Ctrl-C reaches
    # a whole group) once a run finished and another one has a checkpoint.
    # It banks its runs (--bank_dir, --bank_checkpoints) for C below.
    cls.bank = os.path.join(cls.root, 'bank')
    process = subprocess.Popen(
        _sweep_command(cls.spec_path, cls.killed, f'--bank_dir={cls.bank}',
                       '--bank_checkpoints'), cwd=_REPO, env=_env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 600
    running = {}
    while time.time() < deadline:
      time.sleep(0.2)
      if not os.path.exists(os.path.join(cls.killed, 'runs')):
        continue
      try:
        with open(os.path.join(cls.killed, 'running.json')) as f:
          running = json.load(f)
      except (OSError, ValueError):
        continue
      if _finished(cls.killed) and _unfinished_with_checkpoint(cls.killed, running):
        # Freeze the runs, then look again: a 2-round run with a checkpoint can
        # otherwise finish between this check and the sweep's SIGTERM reaching
        # it (the flaky CI failure of b05e45e). SIGKILL ends a stopped group.
        _signal_groups(running.values(), signal.SIGSTOP)
        if _unfinished_with_checkpoint(cls.killed, running):
          break
        _signal_groups(running.values(), signal.SIGCONT)
    os.killpg(process.pid, signal.SIGTERM)
    cls.killed_returncode = process.wait(timeout=120)
    cls.killed_groups = list(running.values())
    cls.finished_at_kill = _finished(cls.killed)
    cls.unfinished_with_checkpoint = [
        r for r in _final_runs(cls.killed)
        if r not in cls.finished_at_kill and _has_checkpoint(cls.killed, r)]
    cls.mtimes_at_kill = {r: os.stat(os.path.join(cls.killed, r, plan.FINISHED_FILE)).st_mtime_ns
                          for r in cls.finished_at_kill}
    cls.rerun_output = _run_sweep(cls.spec_path, cls.killed)
    # C: a fresh checkout, which has only the bank of B as it was killed.
    cls.fresh = os.path.join(cls.root, 'fresh')
    cls.fresh_output = _run_sweep(cls.spec_path, cls.fresh, f'--resume_from={cls.bank}')

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()

  def test_summary_statistics_match_the_runs_csvs(self):
    rows = {r['config']: r for r in _csv_rows(os.path.join(self.full, 'summary', 'summary.csv'))}
    self.assertLen(rows, 4)
    for config, row in rows.items():
      finals = [_metrics(os.path.join(self.full, 'runs', config, f'seed_{s}')) for s in (0, 1)]
      for key in ('accuracy', 'loss'):
        values = [float(f[-1][f'evaluation/{key}']) for f in finals]  # round 2
        mean, std = np.mean(values), np.std(values, ddof=1)
        self.assertAlmostEqual(float(row[f'test_{key}_mean']), mean, places=6)
        self.assertAlmostEqual(float(row[f'test_{key}_std']), std, places=6)
        if std > 0:
          half = _T_975_1 * std / math.sqrt(2)
          self.assertAlmostEqual(float(row[f'test_{key}_ci95_low']), mean - half, places=5)
          self.assertAlmostEqual(float(row[f'test_{key}_ci95_high']), mean + half, places=5)
      curve = [np.mean([float(f[k]['evaluation/accuracy']) for f in finals]) for k in (1, 2)]
      self.assertEqual(int(row['best_round']), 1 + int(np.argmax(curve)))
      self.assertEqual(row['seeds'], '2')
      self.assertEqual(int(float(row['bytes_total_per_client'])), 2 * _BYTES_PER_ROUND)
      # One client a round, capped at one batch (_BASE).
      self.assertEqual(float(row['local_steps_per_client']), 1.0)
      for f in finals:
        self.assertEqual(int(f[1]['comm/bytes_down_per_client']) +
                         int(f[1]['comm/bytes_up_per_client']), _BYTES_PER_ROUND)
    with open(os.path.join(self.full, 'summary', 'summary.md')) as f:
      table = f.read()
    self.assertIn('| client_learning_rate=0.1+server_learning_rate=1.0 | 2 |', table)
    for name in ('accuracy_vs_rounds.png', 'accuracy_vs_bytes.png'):
      self.assertGreater(os.path.getsize(os.path.join(self.full, 'summary', name)), 10_000)
    # Every run's curve, copied beside the summary (it outlives the sweep directory).
    curves = os.path.join(self.full, 'summary', 'curves')
    self.assertLen(os.listdir(curves), 8)
    for config in rows:
      for s in (0, 1):
        self.assertEqual(
            _csv_rows(os.path.join(curves, f'{config}_seed{s}.csv')),
            _csv_rows(os.path.join(self.full, 'runs', config, f'seed_{s}', 'metrics.csv')))

  def test_killed_sweep_resumes_to_the_uninterrupted_results(self):
    self.assertEqual(self.killed_returncode, 128 + signal.SIGTERM)
    self.assertGreaterEqual(len(self.finished_at_kill), 1)
    self.assertLess(len(self.finished_at_kill), 8)
    self.assertNotEmpty(self.unfinished_with_checkpoint)
    # The runs (and their TFF worker_binary) went down with the sweep.
    self.assertNotEmpty(self.killed_groups)
    for pgid in self.killed_groups:
      self.assertEqual(_processes_in_group(pgid), [], pgid)
    for run in self.finished_at_kill:  # not run again
      self.assertEqual(
          os.stat(os.path.join(self.killed, run, plan.FINISHED_FILE)).st_mtime_ns,
          self.mtimes_at_kill[run])
    self._assert_resumed_to_the_uninterrupted_results(self.killed, self.rerun_output)

  def _assert_resumed_to_the_uninterrupted_results(self, sweep_dir, output, no_weights=()):
    """The runs finished at the kill skipped, the others resumed; A's results.

    no_weights: runs without model weights (a bank holds none).
    """
    self.assertIn(f'{len(self.finished_at_kill)} of 8 runs already finished', output)
    for run in self.finished_at_kill:  # not run again
      with open(os.path.join(sweep_dir, plan.LOGS_DIR, run + '.log')) as f:
        self.assertEqual(f.read().count('\n=== '), 1, run)
    for run in self.unfinished_with_checkpoint:  # resumed from its checkpoint
      with open(os.path.join(sweep_dir, plan.LOGS_DIR, run + '.log')) as f:
        second_start = f.read().split('\n=== ')[2]
      # Killed before its last checkpoint: it resumes training from it; killed
      # after it (before final_eval.json): it writes the final outputs from it.
      self.assertRegex(second_start, r'Resuming from checkpoint round|'
                       r'Round \d+ is checkpointed in .*writing the final outputs', run)
    runs = _final_runs(self.full)
    self.assertEqual(runs, _final_runs(sweep_dir))
    self.assertLen(runs, 8)
    for run in runs:
      full, other = os.path.join(self.full, run), os.path.join(sweep_dir, run)
      _assert_rows_close(self, _metrics(full), _metrics(other), run)
      with open(os.path.join(full, plan.FINISHED_FILE)) as a, open(
          os.path.join(other, plan.FINISHED_FILE)) as b:
        _assert_rows_close(self, [json.load(a)], [json.load(b)], run)
      if run not in no_weights:
        for x, y in zip(testing_utils.load_npz_weights(os.path.join(full, 'model_weights.npz')),
                        testing_utils.load_npz_weights(os.path.join(other, 'model_weights.npz'))):
          np.testing.assert_allclose(x, y, rtol=_RTOL, atol=_RTOL)
    _assert_rows_close(self, _csv_rows(os.path.join(self.full, 'summary', 'summary.csv')),
                       _csv_rows(os.path.join(sweep_dir, 'summary', 'summary.csv')), 'summary')

  def test_a_fresh_checkout_resumes_from_the_bank_to_the_uninterrupted_results(self):
    # The bank, as B was killed: finished runs without checkpoints or weights,
    # the unfinished ones with their latest checkpoint only.
    for run in self.finished_at_kill:
      self.assertEqual(sorted(os.listdir(os.path.join(self.bank, run))),
                       ['final_eval.json', 'flags.json', 'metrics.csv'], run)
    for run in self.unfinished_with_checkpoint:
      checkpoints = os.listdir(os.path.join(self.bank, run, 'checkpoints'))
      self.assertLen(checkpoints, 1, run)
      self.assertEqual(checkpoints[0], resumable.latest_checkpoint(os.path.join(self.bank, run)))
    # The others (not started, or with only round 0's checkpoint) are not banked.
    self.assertEqual(_final_runs(self.bank),
                     sorted(self.finished_at_kill | set(self.unfinished_with_checkpoint)))
    self._assert_resumed_to_the_uninterrupted_results(self.fresh, self.fresh_output,
                                                      no_weights=self.finished_at_kill)


class SweepLrSearchTest(absltest.TestCase):
  """A sweep with a learning-rate search; then run on to more rounds with --resume_from."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp(prefix='sweep_search_test_')
    cls.spec_path = _write_spec(cls.root, {
        'name': 'tiny_search', 'base': _BASE, 'seeds': [0],
        'lr_search': {'grid': {'client_learning_rate': [0.05, 0.5]},
                      'validation_fraction': 0.5, 'flags': {'total_rounds': 1}}})
    cls.sweep_dir = os.path.join(cls.root, 'sweep')
    # First only the search (--search_only), then the whole sweep on top of it.
    cls.search_output = _run_sweep(cls.spec_path, cls.sweep_dir, '--search_only')
    cls.runs_after_search = os.listdir(cls.sweep_dir)
    _run_sweep(cls.spec_path, cls.sweep_dir)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()

  def test_search_on_validation_then_runs_on_test_with_the_best_rate(self):
    sweep_dir = self.sweep_dir
    scores = {}
    for lr in ('0.05', '0.5'):
      run_dir = os.path.join(sweep_dir, 'lr_search', 'default', f'client_learning_rate={lr}',
                             'seed_0')
      with open(os.path.join(run_dir, 'flags.json')) as f:
        flags = json.load(f)
      self.assertEqual((flags['eval_split'], flags['validation_fraction'], flags['total_rounds']),
                       ('validation', 0.5, 1))
      with open(os.path.join(run_dir, plan.FINISHED_FILE)) as f:
        final = json.load(f)
      scores[float(lr)] = (final['accuracy'], -final['loss'])
    best = max(scores, key=scores.get)
    with open(os.path.join(sweep_dir, 'runs', 'default', 'seed_0', 'flags.json')) as f:
      flags = json.load(f)
    self.assertEqual((flags['eval_split'], flags['client_learning_rate'], flags['total_rounds']),
                     ('test', best, 2))
    row, = _csv_rows(os.path.join(sweep_dir, 'summary', 'summary.csv'))
    self.assertEqual(float(row['client_learning_rate']), best)
    chosen = [r for r in _csv_rows(os.path.join(sweep_dir, 'summary', 'lr_search.csv'))
              if r['chosen'] == 'True']
    self.assertEqual([float(r['client_learning_rate']) for r in chosen], [best])

  def test_search_only_runs_the_searches_prints_the_choice_and_stops(self):
    self.assertNotIn(plan.RUNS_DIR, self.runs_after_search)
    self.assertIn('lr_search', self.runs_after_search)
    with open(os.path.join(self.sweep_dir, 'runs', 'default', 'seed_0', 'flags.json')) as f:
      best = json.load(f)['client_learning_rate']
    chosen = os.path.join(self.sweep_dir, 'lr_search', 'default',
                          f'client_learning_rate={best:g}', 'seed_0', plan.FINISHED_FILE)
    with open(chosen) as f:
      accuracy = json.load(f)['accuracy']
    self.assertIn(f'the search of default chose client_learning_rate={best:g} (validation '
                  f'accuracy {accuracy:.4f}, one seed)\n', self.search_output)
    self.assertIn('| client_learning_rate | validation accuracy |\n|---|---|\n', self.search_output)
    # 0.5 is the grid's largest value, 0.05 its smallest: either choice is at an edge.
    self.assertIn("warning: the search of default chose a value at its grid's edge",
                  self.search_output)
    for lr in ('0.05', '0.5'):  # the whole sweep did not run the searches again
      search = os.path.join('lr_search', 'default', f'client_learning_rate={lr}', 'seed_0')
      with open(os.path.join(self.sweep_dir, plan.LOGS_DIR, search + '.log')) as f:
        self.assertEqual(f.read().count('\n=== '), 1, search)

  def test_resume_from_runs_a_finished_sweep_on_to_the_same_results_as_from_scratch(self):
    # A spec that "extends" the finished one with 3 rounds instead of 2.
    longer = os.path.join(self.root, 'tiny_search_3.json')
    with open(longer, 'w') as f:
      json.dump({'extends': os.path.basename(self.spec_path), 'name': 'tiny_search_3',
                 'base': {'total_rounds': 3}}, f)
    carried = os.path.join(self.root, 'carried')
    output = _run_sweep(longer, carried, f'--resume_from={self.sweep_dir}')
    self.assertIn('3 run(s) copied (1 to train to more rounds, 2 with the same rounds; '
                  'unfinished copies resume from their checkpoints), 0 not copied', output)
    final = os.path.join(plan.RUNS_DIR, 'default', 'seed_0')
    with open(os.path.join(carried, plan.LOGS_DIR, final + '.log')) as f:
      log = f.read()
    self.assertEqual(log.count('\n=== '), 2)  # its first run, then the resumed one
    self.assertIn('Resuming from checkpoint round 2', log.split('\n=== ')[2])
    for lr in ('0.05', '0.5'):  # the search runs were copied, not run again
      search = os.path.join('lr_search', 'default', f'client_learning_rate={lr}', 'seed_0')
      with open(os.path.join(carried, plan.LOGS_DIR, search + '.log')) as f:
        self.assertEqual(f.read().count('\n=== '), 1, search)
    # The same sweep from scratch: the same rate chosen, the same 3 rounds bit for bit.
    scratch = os.path.join(self.root, 'scratch')
    _run_sweep(longer, scratch)
    _assert_rows_close(self, _metrics(os.path.join(scratch, final)),
                       _metrics(os.path.join(carried, final)), final)
    self.assertEqual(len(_metrics(os.path.join(carried, final))),
                     len(_metrics(os.path.join(scratch, final))))
    for x, y in zip(testing_utils.load_npz_weights(os.path.join(scratch, final,
                                                                'model_weights.npz')),
                    testing_utils.load_npz_weights(os.path.join(carried, final,
                                                                'model_weights.npz'))):
      np.testing.assert_array_equal(x, y)
    # The earlier sweep is untouched: still finished, with fewer rounds.
    self.assertTrue(os.path.exists(os.path.join(self.sweep_dir, final, plan.FINISHED_FILE)))
    self.assertLess(len(_metrics(os.path.join(self.sweep_dir, final))),
                    len(_metrics(os.path.join(carried, final))))

    # The same from a bank of the finished sweep (a fresh checkout has no
    # outputs/): with --bank_final_checkpoints its runs train on from round 2.
    bank = os.path.join(self.root, 'bank')
    _run_sweep(self.spec_path, self.sweep_dir, '--summary_only', f'--bank_dir={bank}',
               '--bank_final_checkpoints')
    self.assertEqual(os.listdir(os.path.join(bank, final, resumable.CHECKPOINTS_DIR)),
                     ['program_state_2'])
    self.assertNotIn('model_weights.npz', os.listdir(os.path.join(bank, final)))
    from_bank = os.path.join(self.root, 'from_bank')
    output = _run_sweep(longer, from_bank, f'--resume_from={bank}')
    self.assertIn('3 run(s) copied (1 to train to more rounds', output)
    with open(os.path.join(from_bank, plan.LOGS_DIR, final + '.log')) as f:
      self.assertIn('Resuming from checkpoint round 2', f.read().split('\n=== ')[2])
    self.assertEqual(_metrics(os.path.join(scratch, final)),
                     _metrics(os.path.join(from_bank, final)))


def _check_in_process(argvs):
  return sweep_check.check(argvs), 10


class SweepBadInputTest(absltest.TestCase):
  """Bad input stops with one line before anything runs or is written."""

  def setUp(self):
    super().setUp()
    self.root = self.create_tempdir().full_path
    self.train = sweep.TrainInterface(command=['unused'], check_fn=_check_in_process)

  def _prepare(self, sweep_dir, **fields):
    data = {'name': 'bad', 'base': dict(_BASE)}
    data.update(fields)
    return sweep.prepare(sweep.from_dict(data), sweep_dir, self.train)

  def test_unknown_flag_in_the_grid(self):
    sweep_dir = os.path.join(self.root, 'a')
    with self.assertRaisesRegex(
        sweep.CheckError,
        r'^config client_learning_rat=0.1: --client_learning_rat is not a flag of scripts.train$'):
      self._prepare(sweep_dir, grid={'client_learning_rat': [0.1, 0.2]})
    self.assertFalse(os.path.exists(sweep_dir))

  def test_grid_crossing_two_methods_flags(self):
    with self.assertRaisesRegex(
        sweep.CheckError,
        r'^config frozen_layers=dense1: --frozen_layers belongs to --algorithm=fedpt and does '
        r'not apply to --algorithm=pvt$'):
      self._prepare(os.path.join(self.root, 'b'), base=dict(_BASE, algorithm='pvt'),
                    grid={'frozen_layers': ['dense1']})
    with self.assertRaisesRegex(sweep.CheckError, 'applies only to --aggregator=dp_ftrl/dp_gaussian'):
      self._prepare(os.path.join(self.root, 'c'), grid={'clip_norm': [0.1]})

  def test_layer_name_the_model_lacks(self):
    # Checked against the task's model before any run (and any data load).
    with self.assertRaisesRegex(
        sweep.CheckError,
        r"^config frozen_layers=dense9: --frozen_layers: the model 'emnist_2nn' has no layer "
        r"'dense9' with weights; its layers are: dense1, dense2, dense3$"):
      self._prepare(os.path.join(self.root, 'f'), base=dict(_BASE, algorithm='fedpt'),
                    grid={'frozen_layers': ['dense1', 'dense9']})

  def test_valid_configs_pass_and_a_directory_of_another_sweep_is_refused(self):
    sweep_dir = os.path.join(self.root, 'd')
    prepared = self._prepare(sweep_dir, grid={'client_learning_rate': [0.1, 0.2]})
    self.assertLen(prepared.runs, 2)
    self.assertFalse(os.path.exists(sweep_dir))
    manifest.write(sweep_dir, prepared.spec, 10)
    with self.assertRaisesRegex(sweep.SweepDirError, 'belongs to sweep .bad. with another spec'):
      self._prepare(sweep_dir, grid={'client_learning_rate': [0.1, 0.3]})

  def test_binary_prints_one_error_line_and_exits_2(self):
    spec_path = _write_spec(self.root, {'name': 'bad_binary', 'base': dict(_BASE, algorithm='pvt'),
                                        'grid': {'frozen_layers': ['dense1']}})
    sweep_dir = os.path.join(self.root, 'e')
    result = subprocess.run(_sweep_command(spec_path, sweep_dir), cwd=_REPO, env=_env(),
                            capture_output=True, text=True, check=False)
    self.assertEqual(result.returncode, 2)
    self.assertEqual(testing_utils.own_stderr_lines(result.stderr), [
        'error: config frozen_layers=dense1: --frozen_layers belongs to --algorithm=fedpt and '
        'does not apply to --algorithm=pvt'])
    self.assertFalse(os.path.exists(sweep_dir))

    # A bank that is the sweep directory itself: refused before anything is written.
    spec_path = _write_spec(self.root, {'name': 'bad_bank', 'base': _BASE})
    result = subprocess.run(_sweep_command(spec_path, sweep_dir) + [f'--bank_dir={sweep_dir}/'],
                            cwd=_REPO, env=_env(), capture_output=True, text=True, check=False)
    self.assertEqual(result.returncode, 2)
    self.assertEqual(testing_utils.own_stderr_lines(result.stderr),
                     [f'error: --bank_dir={sweep_dir}/ is --sweep_dir itself'])
    self.assertFalse(os.path.exists(sweep_dir))

    # --summary_only with --resume_from would summarize an empty directory (rows of nan).
    result = subprocess.run(
        _sweep_command(spec_path, sweep_dir, '--summary_only', f'--resume_from={self.root}/old'),
        cwd=_REPO, env=_env(), capture_output=True, text=True, check=False)
    self.assertEqual(result.returncode, 2)
    self.assertEqual(testing_utils.own_stderr_lines(result.stderr), [
        f'error: --summary_only copies nothing from --resume_from={self.root}/old: drop '
        '--summary_only to copy its finished runs and write the summary (nothing trains when '
        f'all are finished), or summarize it in place with --summary_only '
        f'--sweep_dir={self.root}/old'])
    self.assertFalse(os.path.exists(sweep_dir))

  def test_search_runs_are_the_searches_and_refused_without_one(self):
    prepared = self._prepare(os.path.join(self.root, 'g'), seeds=[0, 1],
                             lr_search={'grid': {'client_learning_rate': [0.05, 0.5]}})
    self.assertEqual(sorted(r.run_id for r in sweep.search_runs(prepared)), [
        os.path.join('lr_search', 'default', f'client_learning_rate={lr}', 'seed_0')
        for lr in ('0.05', '0.5')])
    self.assertLen(prepared.runs, 4)  # and the two full runs
    with self.assertRaisesRegex(sweep.SpecError, 'no config of this sweep has a learning-rate'):
      sweep.search_runs(self._prepare(os.path.join(self.root, 'h')))

  def test_search_only_without_a_search_is_refused(self):
    spec_path = _write_spec(self.root, {'name': 'no_search', 'base': dict(_BASE)})
    sweep_dir = os.path.join(self.root, 'f')
    result = subprocess.run(_sweep_command(spec_path, sweep_dir, '--search_only'), cwd=_REPO,
                            env=_env(), capture_output=True, text=True, check=False)
    self.assertEqual(result.returncode, 2, result.stderr)
    self.assertIn('error: --search_only: no config of this sweep has a learning-rate search',
                  result.stderr)
    self.assertFalse(os.path.exists(sweep_dir))


if __name__ == '__main__':
  absltest.main()
