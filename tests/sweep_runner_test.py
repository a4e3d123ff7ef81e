"""Tests of the sweep's subprocess scheduler with stand-in runs (no TensorFlow)."""

import io
import json
import os
import signal
import sys
import threading
import time
from unittest import mock

from absl.testing import absltest

from tff_partial.sweep import plan
from tff_partial.sweep import runner
from tff_partial.sweep import spec as spec_lib

# A stand-in for scripts.train: records when it ran, prints round lines, then
# writes final_eval.json (or fails, or starts a grandchild and waits).
_FAKE_RUN = r'''
import json, os, subprocess, sys, time
run_dir, mode = sys.argv[1], sys.argv[2]
os.makedirs(run_dir, exist_ok=True)
start = time.time()
if mode == 'fail':
  sys.exit(3)
if mode == 'hang':
  child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])
  # Atomic: the test reads it as soon as it exists (a loaded machine may
  # stop this process between open() and the write).
  with open(os.path.join(run_dir, 'pids.json.tmp'), 'w') as f:
    json.dump([os.getpid(), child.pid], f)
  os.replace(os.path.join(run_dir, 'pids.json.tmp'), os.path.join(run_dir, 'pids.json'))
  time.sleep(120)
for k in range(3):
  print(f'round {k}/2', flush=True)
  time.sleep(0.2)
with open(os.path.join(run_dir, 'times.json'), 'w') as f:
  json.dump([start, time.time()], f)
with open(os.path.join(run_dir, 'final_eval.json'), 'w') as f:
  json.dump({'accuracy': 0.5, 'loss': 1.0}, f)
'''


def _gone(pid: int) -> bool:
  """True once `pid` no longer exists or is a zombie."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().split(')')[-1].split()[0] == 'Z'
  except FileNotFoundError:
    return True


class RunnerTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.root = self.create_tempdir().full_path
    self.script = os.path.join(self.create_tempdir().full_path, 'fake_run.py')
    with open(self.script, 'w') as f:
      f.write(_FAKE_RUN)

  def _runs(self, **spec_fields):
    spec = spec_lib.from_dict(dict({'name': 't', 'base': {'total_rounds': 2}}, **spec_fields))
    return plan.plan_runs(spec, spec.expand(), 10)

  def _command(self, modes=None):
    def command(run):
      mode = (modes or {}).get(run.run_id, 'ok')
      return [sys.executable, self.script, plan.run_dir(self.root, run), mode]
    return command

  def test_runs_at_most_parallel_at_a_time_and_skips_finished_runs(self):
    runs = self._runs(grid={'client_epochs': [1, 2, 3, 4, 5]})
    lines = []
    report = runner.Runner(self.root, runs, self._command(), parallel=2, name='t',
                           print_fn=lines.append, poll_seconds=0.05, interactive=False).run()
    self.assertEqual(set(report.states.values()), {'done'})
    intervals = []
    for run in runs:
      with open(os.path.join(plan.run_dir(self.root, run), 'times.json')) as f:
        intervals.append(json.load(f))
    for start, _ in intervals:  # runs alive at each start
      self.assertLessEqual(sum(s <= start < e for s, e in intervals), 2)
    self.assertIn('sweep t: 5/5 runs done, 0 running, 0 left | rounds 10/10', lines[-1])
    with open(plan.log_path(self.root, runs[0])) as f:
      self.assertIn('round 2/2', f.read())
    # A second pass starts nothing.
    again = runner.Runner(self.root, runs, self._command(), parallel=2, print_fn=lines.append,
                          poll_seconds=0.05, interactive=False).run()
    self.assertEqual(set(again.states.values()), {'finished_before'})
    self.assertIn('5 of 5 runs already finished', ' '.join(lines))

  def test_progress_of_jobs_without_rounds_counts_runs(self):
    # Adaptation jobs (scripts.adapt_sweep) have no rounds: no "rounds 0/0",
    # and an ETA from the runs finished so far (running ones half done).
    runs = [plan.Run(run_id=f'a/seed_{s}', config='a', seed=s, flags={}, total_rounds=0)
            for s in range(4)]
    jobs = runner.Runner(self.root, runs, self._command(), name='adaptation', dependencies={},
                         interactive=False)
    for job, state in zip(jobs._jobs, ('done', 'running', 'pending', 'pending')):
      job.state = state
    jobs._started = time.monotonic() - 100
    self.assertEqual(jobs.progress_line(), 'sweep adaptation: 1/4 runs done, 1 running, 2 left | '
                     '0:01:40 elapsed | ETA 0:04:10')  # 2.5 runs x 100 s

  def test_a_note_clears_the_interactive_progress_line_first(self):
    runs = [plan.Run(run_id='a/seed_0', config='a', seed=0, flags={}, total_rounds=2)]
    printed = []
    jobs = runner.Runner(self.root, runs, self._command(), name='t', dependencies={},
                         print_fn=printed.append, interactive=True)
    with mock.patch.object(sys, 'stdout', new_callable=io.StringIO) as out:
      jobs._show()
      line = out.getvalue()[1:]
      jobs.note('the search of a chose x=1')
      jobs._show()
    self.assertEqual(printed, ['the search of a chose x=1'])
    # The note goes to a cleared line; the progress line is drawn anew after it.
    self.assertEqual(out.getvalue(), f'\r{line}\r{" " * len(line)}\r\r{line}')

  def test_rounds_logged_before_count_as_done_in_the_eta(self):
    # Two runs of 500 rounds copied at round 300 (--resume_from) or stopped
    # there by an earlier invocation, one untouched: 600 of 1,500 rounds done
    # before any starts. One of them then runs 50 rounds in 100 s.
    runs = [plan.Run(run_id=f'a/seed_{s}', config='a', seed=s, flags={}, total_rounds=500)
            for s in range(3)]
    for run in runs[:2]:
      os.makedirs(os.path.dirname(plan.log_path(self.root, run)), exist_ok=True)
      with open(plan.log_path(self.root, run), 'w') as f:
        f.write('round 299/300\nround 300/300\n')
    jobs = runner.Runner(self.root, runs, self._command(), name='t', dependencies={},
                         interactive=False)
    self.assertIn('rounds 600/1500', jobs.progress_line())
    job = jobs._jobs[0]
    with open(plan.log_path(self.root, job.run), 'a') as f:
      job.log_offset = f.tell()
      f.write('round 301/500\n')
    job.state = 'running'
    jobs._read_round(job)
    with open(plan.log_path(self.root, job.run), 'a') as f:
      f.write('round 350/500\n')
    jobs._read_round(job)
    jobs._started = time.monotonic() - 100
    # 850 rounds left at 50 rounds per 100 s.
    self.assertEqual(jobs.progress_line(), 'sweep t: 0/3 runs done, 1 running, 2 left | '
                     'rounds 650/1500 | 0:01:40 elapsed | ETA 0:28:20')

  def test_failed_search_run_skips_the_runs_that_need_it(self):
    runs = self._runs(configs=[{'name': 'a'}, {'name': 'b', 'lr_search': False}],
                      lr_search={'grid': {'client_learning_rate': [0.1, 1.0]}})
    failing = 'lr_search/a/client_learning_rate=1.0/seed_0'
    report = runner.Runner(self.root, runs, self._command({failing: 'fail'}), parallel=2,
                           print_fn=lambda _: None, poll_seconds=0.05, interactive=False).run()
    self.assertEqual(report.states, {
        'lr_search/a/client_learning_rate=0.1/seed_0': 'done', failing: 'failed',
        'runs/a/seed_0': 'skipped', 'runs/b/seed_0': 'done'})
    self.assertIn('exit code 3', report.reasons[failing])
    self.assertIn('1 run(s) it needs failed', report.reasons['runs/a/seed_0'])

  def test_sigterm_stops_every_run_with_its_process_group(self):
    runs = self._runs(grid={'client_epochs': [1, 2, 3]})
    modes = {r.run_id: 'hang' for r in runs}
    pid_files = [os.path.join(plan.run_dir(self.root, r), 'pids.json') for r in runs[:2]]

    def interrupt_when_started():
      deadline = time.time() + 60
      while not all(os.path.exists(p) for p in pid_files) and time.time() < deadline:
        time.sleep(0.05)
      time.sleep(0.2)
      os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=interrupt_when_started, daemon=True).start()
    sweep = runner.Runner(self.root, runs, self._command(modes), parallel=2,
                          print_fn=lambda _: None, poll_seconds=0.05, grace_seconds=5,
                          interactive=False)
    with self.assertRaises(runner.SweepInterrupted) as cm:
      sweep.run()
    self.assertEqual(cm.exception.signum, signal.SIGTERM)
    pids = []
    for path in pid_files:
      with open(path) as f:
        pids += json.load(f)  # the run and its grandchild (as TFF's worker_binary)
    deadline = time.time() + 10
    while not all(_gone(p) for p in pids) and time.time() < deadline:
      time.sleep(0.05)
    self.assertTrue(all(_gone(p) for p in pids), pids)
    with open(os.path.join(self.root, 'running.json')) as f:
      self.assertEqual(json.load(f), {})
    self.assertEqual(signal.getsignal(signal.SIGTERM), signal.SIG_DFL)


if __name__ == '__main__':
  absltest.main()
