"""Runs a sweep's training runs as subprocesses, N at a time, with one progress line.

Each run is a `scripts.train` process in a session (and process group) of its
own, so that it, and the TFF `worker_binary` it starts, can be stopped
together by group id without touching anything else. On SIGINT or SIGTERM
the sweep sends SIGTERM to each running run's group, SIGKILL after a grace
period, and raises `SweepInterrupted`; rerunning the sweep skips finished
runs and lets the training loop resume the others from their checkpoints.
Runs also get SIGTERM if the sweep process itself dies (Linux
`PR_SET_PDEATHSIG`), so none keeps writing into the sweep directory.

Python's `subprocess` has no job pool with dependencies, process groups and
progress; this small scheduler is written here for that.
"""

import collections
import ctypes
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Callable, Mapping, Optional, Sequence

from tff_partial.sweep import plan
from tff_partial.training import atomic

_ROUND_LINE = re.compile(rb'round (\d+)/(\d+)')
_TAIL_BYTES = 16384
_RUNNING_FILE = 'running.json'


class SweepInterrupted(Exception):
  """A signal stopped the sweep; the running runs were stopped too."""

  def __init__(self, signum: int):
    super().__init__(f'interrupted by {signal.Signals(signum).name}')
    self.signum = signum


class SkipRun(Exception):
  """Raised by a command function: the run cannot start (the message says why)."""


class AlreadyFinished(Exception):
  """Raised by a command function: the run needs no training (the message says why)."""


@dataclasses.dataclass
class _Job:
  run: plan.Run
  deps: list
  state: str = 'pending'  # pending, running, done, finished_before, failed, skipped
  process: Optional[subprocess.Popen] = None
  slot: Optional[int] = None
  reason: str = ''
  first_round: Optional[int] = None
  latest_round: int = 0
  log: Optional[object] = None
  log_offset: int = 0  # where this invocation's output starts in the log


@dataclasses.dataclass
class SweepReport:
  """What happened to every run: id -> state (and why for failed/skipped)."""

  states: dict
  reasons: dict
  seconds: float

  def ids(self, *states) -> list:
    return [i for i, s in self.states.items() if s in states]


def _set_parent_death_signal() -> None:
  """In the child before exec: SIGTERM it when the sweep process dies (Linux)."""
  try:
    libc = ctypes.CDLL('libc.so.6', use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
  except OSError:
    pass


def _kill_group(pgid: int, sig: int) -> None:
  try:
    os.killpg(pgid, sig)
  except (ProcessLookupError, PermissionError):
    pass


def _group_alive(pgid: int) -> bool:
  try:
    os.killpg(pgid, 0)
    return True
  except (ProcessLookupError, PermissionError):
    return False


def _format_seconds(seconds: float) -> str:
  seconds = int(round(seconds))
  return f'{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}'


class Runner:
  """Schedules `runs` over `parallel` slots; `command_fn(run)` gives each argv.

  command_fn: run -> argv list, called when the run starts (after its
    dependencies finished); raises `SkipRun` if it cannot run.
  workers: TFF worker addresses, shared out among the slots: slot i gets
    every `parallel`-th one from i (passed as the run's `--workers`).
  is_finished: (sweep_dir, run) -> whether the run has its results (default:
    a training run's `final_eval.json`); runs of other binaries give theirs.
  dependencies: run id -> the run ids that must finish first (default: a
    training run waits for its config's learning-rate search).
  running_file: the file in `sweep_dir` listing the running runs' process
    groups; binaries that run in the same directory as a training sweep
    (scripts.adapt_sweep) give their own.
  on_done: called with each run that finishes in this invocation, as it
    finishes (`scripts.sweep --bank_dir` banks it).
  """

  def __init__(self, sweep_dir: str, runs: Sequence[plan.Run], command_fn: Callable,
               *, parallel: int = 1, workers: Sequence[str] = (), name: str = 'sweep',
               print_fn: Callable[[str], None] = print, poll_seconds: float = 0.5,
               grace_seconds: float = 15.0, env: Optional[dict] = None,
               interactive: Optional[bool] = None,
               is_finished: Callable[[str, plan.Run], bool] = plan.is_finished,
               dependencies: Optional[Mapping[str, Sequence[str]]] = None,
               running_file: str = _RUNNING_FILE,
               on_done: Optional[Callable[[plan.Run], None]] = None):
    if parallel < 1:
      raise ValueError(f'--parallel={parallel} must be >= 1')
    if workers and len(workers) < parallel:
      raise ValueError(f'--workers lists {len(workers)} worker(s); --parallel={parallel} '
                       'needs at least one per parallel run')
    self._dir = sweep_dir
    self._running_file = running_file
    self._jobs = [_Job(r, list(dependencies.get(r.run_id, ())) if dependencies is not None
                       else plan.dependencies(r, runs)) for r in runs]
    self._is_finished = is_finished
    self._on_done = on_done
    self._by_id = {j.run.run_id: j for j in self._jobs}
    # A run trained part of the way by an earlier invocation (or copied by
    # --resume_from) counts its logged rounds as done before it restarts, so
    # the ETA is not that of training it from scratch. The rounds after its
    # last checkpoint are retrained: an ETA low by at most that much.
    for job in self._jobs:
      job.latest_round = self._logged_round(job, 0) or 0
    self._command_fn = command_fn
    self._parallel = parallel
    self._slot_workers = [list(workers[i::parallel]) for i in range(parallel)] if workers else None
    self._name = name
    self._print = print_fn
    self._poll = poll_seconds
    self._grace = grace_seconds
    self._env = dict(os.environ if env is None else env)
    self._env.setdefault('PYTHONUNBUFFERED', '1')  # round lines reach the log as they happen
    self._interactive = sys.stdout.isatty() if interactive is None else interactive
    self._signal = None
    self._last_line = None
    self._last_print = 0.0
    self._started = time.monotonic()

  # --- processes --------------------------------------------------------------
  def _start(self, job: _Job, slot: int) -> None:
    try:
      argv = list(self._command_fn(job.run))
    except SkipRun as e:
      job.state, job.reason = 'skipped', str(e)
      return
    except AlreadyFinished as e:
      job.state, job.reason = 'finished_before', str(e)
      return
    # command_fn may just have copied the run from an earlier sweep (its
    # search chose the values it trained with): count its logged rounds too.
    job.latest_round = max(job.latest_round, self._logged_round(job, 0) or 0)
    if self._slot_workers is not None:
      argv.append(f'--workers={",".join(self._slot_workers[slot])}')
    path = plan.log_path(self._dir, job.run)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    job.log = open(path, 'ab')
    job.log_offset = job.log.tell()
    job.log.write(f'\n=== {time.strftime("%Y-%m-%d %H:%M:%S")} {" ".join(argv)}\n'.encode())
    job.log.flush()
    job.process = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=job.log, stderr=subprocess.STDOUT,
        env=self._env, start_new_session=True, preexec_fn=_set_parent_death_signal)
    job.state, job.slot = 'running', slot

  def _finish(self, job: _Job, returncode: int) -> None:
    # Anything the run left in its group (a TFF worker_binary) goes with it.
    _kill_group(job.process.pid, signal.SIGKILL)
    job.log.close()
    if returncode == 0 and self._is_finished(self._dir, job.run):
      job.state = 'done'
      job.latest_round = job.run.total_rounds
      if self._on_done is not None:
        self._on_done(job.run)
    else:
      job.state = 'failed'
      job.reason = (f'exit code {returncode}; see '
                    f'{os.path.relpath(plan.log_path(self._dir, job.run), self._dir)}')
    job.process = None

  def _stop_all(self) -> None:
    running = [j for j in self._jobs if j.process is not None]
    for job in running:
      _kill_group(job.process.pid, signal.SIGTERM)
    deadline = time.monotonic() + self._grace
    for job in running:
      try:
        job.process.wait(timeout=max(0.0, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        pass
      _kill_group(job.process.pid, signal.SIGKILL)
      job.process.wait()
      # Wait until its group (the worker_binary) is gone as well.
      while _group_alive(job.process.pid) and time.monotonic() < deadline + 5:
        time.sleep(0.05)
      job.log.close()
      job.state, job.process = 'pending', None
    self._write_running()

  def _write_running(self) -> None:
    """`running_file`: the running runs' process group ids (for tools and tests)."""
    running = {j.run.run_id: j.process.pid for j in self._jobs if j.process is not None}
    with atomic.atomic_write(os.path.join(self._dir, self._running_file)) as f:
      json.dump(running, f, indent=2, sort_keys=True)

  # --- progress ----------------------------------------------------------------
  def _logged_round(self, job: _Job, offset: int) -> Optional[int]:
    """The last round the run's log reports after `offset`; None if none."""
    path = plan.log_path(self._dir, job.run)
    try:
      with open(path, 'rb') as f:
        f.seek(max(offset, os.path.getsize(path) - _TAIL_BYTES))
        matches = _ROUND_LINE.findall(f.read())
    except OSError:
      return None
    return int(matches[-1][0]) if matches else None

  def _read_round(self, job: _Job) -> None:
    latest = self._logged_round(job, job.log_offset)
    if latest is not None:
      if job.first_round is None:
        job.first_round = latest
      job.latest_round = max(job.latest_round, latest)

  def progress_line(self) -> str:
    counts = collections.Counter(j.state for j in self._jobs)
    done = counts['done'] + counts['finished_before']
    total_rounds = sum(j.run.total_rounds for j in self._jobs if j.state != 'skipped')
    rounds_done = sum(j.run.total_rounds if j.state in ('done', 'finished_before')
                      else j.latest_round for j in self._jobs if j.state != 'skipped')
    progressed = sum(j.latest_round - max(0, j.first_round - 1) for j in self._jobs
                     if j.first_round is not None)
    elapsed = time.monotonic() - self._started
    left = counts['pending']
    parts = [f'sweep {self._name}: {done}/{len(self._jobs)} runs done, '
             f'{counts["running"]} running, {left} left']
    if counts['failed'] or counts['skipped']:
      parts[0] += f', {counts["failed"]} failed, {counts["skipped"]} skipped'
    if total_rounds:
      parts.append(f'rounds {rounds_done}/{total_rounds}')
    parts.append(f'{_format_seconds(elapsed)} elapsed')
    if counts['running'] or left:
      if total_rounds and progressed > 0:
        parts.append(f'ETA {_format_seconds((total_rounds - rounds_done) * elapsed / progressed)}')
      elif not total_rounds and counts['done']:
        # Jobs without rounds (adaptation runs): by the runs finished in this
        # invocation; the running ones count as half done.
        to_go = left + counts['running'] / 2
        parts.append(f'ETA {_format_seconds(to_go * elapsed / counts["done"])}')
    return ' | '.join(parts)

  def note(self, line: str) -> None:
    """Prints `line` between progress lines (an interactive one is cleared first)."""
    if self._interactive and self._last_line:
      sys.stdout.write('\r' + ' ' * len(self._last_line) + '\r')
      sys.stdout.flush()
      self._last_line = None
    self._print(line)

  def _show(self, force: bool = False) -> None:
    line = self.progress_line()
    now = time.monotonic()
    if self._interactive:
      sys.stdout.write('\r' + line.ljust(len(self._last_line or '')))
      sys.stdout.flush()
    else:
      # One line per change of the run counts (not per tick), plus one a minute.
      key = line.split(' | ')[0]
      if force or key != (self._last_line or '').split(' | ')[0] or now - self._last_print > 60:
        self._print(line)
        self._last_print = now
    self._last_line = line

  # --- the loop -----------------------------------------------------------------
  def _on_signal(self, signum, frame):
    del frame
    self._signal = signum

  def run(self) -> SweepReport:
    """Runs every unfinished run; returns what happened. SweepInterrupted on a signal."""
    for job in self._jobs:
      if self._is_finished(self._dir, job.run):
        job.state = 'finished_before'
    before = sum(j.state == 'finished_before' for j in self._jobs)
    if before:
      self._print(f'sweep {self._name}: {before} of {len(self._jobs)} runs already finished '
                  '(skipped); unfinished runs resume from their checkpoints')
    handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
      self._loop()
    finally:
      if any(j.process is not None for j in self._jobs):
        self._stop_all()
      for sig, handler in handlers.items():
        signal.signal(sig, handler)
      if self._interactive and self._last_line:
        sys.stdout.write('\n')
    if self._signal is not None:
      raise SweepInterrupted(self._signal)
    self._show(force=True)
    return SweepReport(
        states={j.run.run_id: j.state for j in self._jobs},
        reasons={j.run.run_id: j.reason for j in self._jobs if j.reason},
        seconds=time.monotonic() - self._started)

  def _ready(self, job: _Job) -> bool:
    states = [self._by_id[d].state for d in job.deps]
    if any(s in ('failed', 'skipped') for s in states):
      bad = [d for d in job.deps if self._by_id[d].state in ('failed', 'skipped')]
      job.state, job.reason = 'skipped', f'{len(bad)} run(s) it needs failed, e.g. {bad[0]}'
      return False
    return all(s in ('done', 'finished_before') for s in states)

  def _loop(self) -> None:
    while self._signal is None:
      changed = False
      for job in self._jobs:
        if job.process is not None and job.process.poll() is not None:
          self._finish(job, job.process.returncode)
          changed = True
      running = [j for j in self._jobs if j.state == 'running']
      free = [s for s in range(self._parallel) if s not in {j.slot for j in running}]
      for job in self._jobs:
        if not free or self._signal is not None:
          break
        if job.state == 'pending' and self._ready(job):
          self._start(job, free[0])
          if job.state == 'running':
            free.pop(0)
          changed = True
      if changed:
        self._write_running()
      for job in self._jobs:
        if job.state == 'running':
          self._read_round(job)
      if not any(j.state in ('pending', 'running') for j in self._jobs):
        return
      self._show()
      time.sleep(self._poll)
