"""Tests of tff_partial.runtime: rounds on several TFF workers."""
# bazel: size=large

import asyncio
import gc
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from unittest import mock

from absl import flags
from absl.testing import absltest
from absl.testing import flagsaver
import numpy as np
import psutil
import tensorflow_federated as tff

from scripts import flag_groups
from scripts import runtime_flags
from tests import runtime_testing as rt
from tff_partial import runtime
from tff_partial.runtime import local
from tff_partial.runtime import workers as workers_lib

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class RuntimeTest(rt.RuntimeTestCase):

  def test_two_workers_give_the_local_result(self):
    initial = rt.weights(self.process, self.process.initialize())
    local = rt.weights(self.process, self.train(2))
    with runtime.local_workers(2) as workers:
      runtime.configure(workers.addresses)
      self.assertEqual(runtime.configured_workers(), workers.addresses)
      remote = rt.weights(self.process, self.train(2))
    self.assert_close(local, remote)
    # The rounds trained something (the test would pass on a no-op otherwise).
    self.assertGreater(np.max(np.abs(local[0] - initial[0])), 1e-3)

  def test_bounded_subrounds_give_the_local_result(self):
    local = rt.weights(self.process, self.train(2))
    with runtime.local_workers(2) as workers:
      runtime.configure(workers.addresses, max_clients_per_subround=1)
      with runtime.ResourceUsage(workers) as usage:
        state = self.train(2)
      context = tff.framework.get_context_stack().current
      # 3 clients, at most 1 per sub-round: 3 sub-rounds on 2 workers.
      self.assertEqual(context._num_subrounds, 3)  # pylint: disable=protected-access
      remote = rt.weights(self.process, state)
    self.assert_close(local, remote)
    used = usage.result()
    self.assertLen(used['worker_cpu_seconds'], 2)
    for cpu, peak in zip(used['worker_cpu_seconds'], used['worker_peak_rss_bytes']):
      self.assertGreater(cpu, 0.0)  # both workers ran sub-rounds
      self.assertGreater(peak, 50 * 2**20)  # a TF runtime is resident

  def test_killed_worker_fails_clearly_and_run_resumes(self):
    expected = rt.weights(self.process, self.train(2))
    root = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, root, ignore_errors=True)
    checkpoints = tff.program.FileProgramStateManager(root)
    with runtime.local_workers(2) as workers:
      runtime.configure(workers.addresses)
      state = self.train(1)
      asyncio.run(checkpoints.save(state, 1))
      workers[1].kill()
      start = time.monotonic()
      with self.assertRaisesRegex(runtime.WorkerError,
                                  f'worker {workers[1].address} is unreachable'):
        self.train(1, state)
      self.assertLess(time.monotonic() - start, 30.0)  # no hang
    # Resume: new workers, the same flags, the last checkpoint.
    with runtime.local_workers(2) as workers:
      runtime.configure(workers.addresses)
      restored, version = asyncio.run(
          checkpoints.load_latest(self.process.initialize()))
      self.assertEqual(version, 1)
      resumed = rt.weights(self.process, self.train(1, restored))
    self.assert_close(expected, resumed)

  def test_worker_killed_while_rounds_run_fails_without_hang(self):
    with runtime.local_workers(2) as workers:
      runtime.configure(workers.addresses)
      state = self.train(1)  # compiled and warm
      killer = threading.Timer(1.0, workers[0].kill)
      killer.start()
      self.addCleanup(killer.cancel)
      with self.assertRaisesRegex(runtime.WorkerError, workers[0].address):
        for _ in range(500):  # rounds keep running until the worker dies
          state = self.process.next(state, self.data).state
      killer.join()
      self.assertFalse(workers[0].alive())

  def test_rejects_non_loopback_without_opt_in_and_malformed_addresses(self):
    with self.assertRaisesRegex(
        ValueError, r"'10.0.0.1:5000' is not a loopback address; non-loopback "
        r'addresses need --allow_remote_workers, because TFF workers speak '
        r'plaintext, unauthenticated gRPC'):
      runtime.configure(['10.0.0.1:5000'])
    with self.assertRaisesRegex(ValueError, 'not host:port'):
      runtime.configure(['127.0.0.1'])
    with self.assertRaisesRegex(ValueError, 'duplicate'):
      runtime.configure(['127.0.0.1:5000', '127.0.0.1:5000'])
    with self.assertRaisesRegex(ValueError, 'must be >= 1'):
      runtime.create_context(['127.0.0.1:5000'], max_clients_per_subround=0)
    # With the opt-in, any host parses (nothing is contacted here).
    self.assertEqual(workers_lib.split_address('10.0.0.1:5000', allow_remote=True),
                     ('10.0.0.1', 5000))
    self.assertEqual(workers_lib.split_address('[fd00::2]:7', allow_remote=True),
                     ('[fd00::2]', 7))
    self.assertEqual(workers_lib.split_address('[::1]:7'), ('[::1]', 7))
    self.assertEqual(workers_lib.split_address('localhost:7'), ('localhost', 7))

  @flagsaver.flagsaver
  def test_flag_refuses_a_remote_worker_in_one_line(self):
    flags.FLAGS.workers = ['10.0.0.1:5000']
    with self.assertRaises(flag_groups.FlagError) as cm:
      runtime_flags.configure_from_flags()
    message = str(cm.exception)
    self.assertNotIn('\n', message)
    self.assertIn('--allow_remote_workers', message)
    self.assertIn('run any TensorFlow graph', message)

  def test_unreachable_worker_fails_at_configure(self):
    port = workers_lib.portpicker.pick_unused_port()  # nothing listens there
    with self.assertRaisesRegex(runtime.WorkerError, 'did not become reachable'):
      runtime.configure([f'127.0.0.1:{port}'], ready_timeout_s=1.0)


class LocalRuntimeTest(absltest.TestCase):
  """The local runtime's context (`local.LocalContext`) and worker exposure."""

  def setUp(self):
    super().setUp()
    self.addCleanup(runtime.configure, None)

  def test_local_context_equals_tffs_local_runtime(self):
    process, data = rt.fedavg_process(), rt.client_data()
    runtime.configure(None)
    ours = rt.weights(process, rt.train(process, data, 2))
    tff.backends.native.set_sync_local_cpp_execution_context()
    self.addCleanup(_kill_tffs_own_workers)
    theirs = rt.weights(process, rt.train(process, data, 2))
    self.assertLen(ours, 2)
    for a, b in zip(theirs, ours):
      np.testing.assert_array_equal(a, b)  # same executors: bit for bit

  def test_client_parallelism_splits_the_cores_among_clients(self):
    cp = local.client_parallelism
    self.assertEqual(cp('tff', cores=2), (-1, None))  # TFF's worker
    # auto: one thread per client on any machine (the same rounding everywhere).
    self.assertEqual(cp('auto', cores=2), (2, 1))
    self.assertEqual(cp('auto', cores=16), (16, 1))
    self.assertEqual(cp('auto', cores=1), (1, 1))
    self.assertEqual(cp('1', cores=2), (1, 2))
    self.assertEqual(cp('4', cores=2), (4, 1))
    for bad in ('0', '-2', 'many'):
      with self.assertRaisesRegex(ValueError, 'valid values: auto, tff or a positive integer'):
        cp(bad, cores=2)
    with flagsaver.flagsaver(local_client_parallelism='lots'):
      with self.assertRaisesRegex(flag_groups.FlagError,
                                  "--local_client_parallelism='lots'"):
        runtime_flags.configure_from_flags()

  def test_auto_parallelism_gives_the_worker_its_threads_and_calls(self):
    with flagsaver.flagsaver(local_client_parallelism='auto', clients_per_round=3,
                             workers=[]):  # one client per core, 1 thread, any cohort
      runtime_flags.configure_from_flags()
    context = tff.framework.get_context_stack().current
    self.assertIsInstance(context, local.LocalContext)
    self.assertEqual(_federated_sum([1.0, 2.0]), 3.0)  # starts the worker
    process = psutil.Process(context.worker.process.pid)
    self.assertEqual(process.environ().get('TF_NUM_INTRAOP_THREADS'), '1')
    self.assertIn(f'--max_concurrent_computation_calls={local.available_cores()}',
                  process.cmdline())
    # TFF's default: no thread setting of ours, every client at once.
    with flagsaver.flagsaver(local_client_parallelism='tff', workers=[]):
      runtime_flags.configure_from_flags()
    context = tff.framework.get_context_stack().current
    self.assertEqual(_federated_sum([1.0, 2.0]), 3.0)
    process = psutil.Process(context.worker.process.pid)
    self.assertEqual(process.environ().get('TF_NUM_INTRAOP_THREADS'),
                     os.environ.get('TF_NUM_INTRAOP_THREADS'))
    self.assertIn('--max_concurrent_computation_calls=-1', process.cmdline())

  def test_restarted_worker_gives_the_same_results(self):
    process, data = rt.fedavg_process(), rt.client_data()
    runtime.configure(None)
    self.assertFalse(local.restart_local_worker())  # no worker yet: nothing to do
    self.assertTrue(math.isnan(local.local_worker_rss_mb()))
    state = rt.train(process, data, 1)
    context = tff.framework.get_context_stack().current
    first = context.worker
    self.assertGreater(local.local_worker_rss_mb(), 10)
    self.assertTrue(local.restart_local_worker())
    self.assertFalse(first.alive())
    self.assertIsNone(context.worker)
    restarted = rt.weights(process, process.next(state, data).state)
    self.assertTrue(context.worker.alive())
    self.assertNotEqual(context.worker.process.pid, first.process.pid)
    uninterrupted = rt.weights(process, rt.train(process, data, 2))
    self.assertLen(restarted, 2)
    for a, b in zip(uninterrupted, restarted):
      np.testing.assert_array_equal(a, b)

  def test_replacing_tffs_context_does_not_hang_when_sigint_is_ignored(self):
    # A background job of a non-interactive shell (and a pytest-xdist worker)
    # starts with SIGINT ignored; TFF's worker inherits that, and TFF stops it
    # with SIGINT and waits. Replacing TFF's context must not hang there.
    program = (
        'import gc, signal\n'
        'signal.signal(signal.SIGINT, signal.SIG_IGN)\n'
        'import numpy as np\n'
        'import tensorflow_federated as tff\n'
        'tff.backends.native.set_sync_local_cpp_execution_context()\n'
        '@tff.tensorflow.computation(np.int32)\n'
        'def f(x):\n'
        '  return x\n'
        'assert f(1) == 1\n'
        'from tff_partial.runtime import local\n'
        'local.install()\n'
        'gc.collect()\n'
        'print("replaced")\n')
    result = subprocess.run([sys.executable, '-c', program], cwd=_ROOT, timeout=300,
                            capture_output=True, text=True, check=False)
    self.assertEqual(result.returncode, 0, result.stderr[-2000:])
    self.assertIn('replaced', result.stdout)

  def test_import_replaces_tffs_context_only(self):
    tff.backends.native.set_sync_local_cpp_execution_context()
    self.assertTrue(local.install_if_tff_default())
    ours = tff.framework.get_context_stack().current
    self.assertIsInstance(ours, local.LocalContext)
    self.assertFalse(local.install_if_tff_default())  # ours is kept ...
    users = tff.backends.native.create_mergeable_comp_execution_context([])
    tff.framework.set_default_context(users)
    self.assertFalse(local.install_if_tff_default())  # ... and a user's
    self.assertIs(tff.framework.get_context_stack().current, users)

  def test_started_workers_listen_on_loopback_only(self):
    hosts = rt.host_addresses()
    if not hosts:
      self.skipTest('this machine has no non-loopback address')
    context = local.install()
    self.assertEqual(_federated_sum([1.0, 2.0]), 3.0)
    with runtime.local_workers(1) as started:
      for worker in (context.worker, started[0]):
        self.assertEqual(
            workers_lib.listening_addresses(worker.process.pid, worker.port),
            {'127.0.0.1'})
        self.assertTrue(rt.accepts('127.0.0.1', worker.port))
        for host in hosts:
          self.assertFalse(rt.accepts(host, worker.port), f'{host}:{worker.port}')
    # Control: the probe does reach a worker that listens on every interface.
    with self.assertRaisesRegex(ValueError, '--allow_remote_workers'):
      with runtime.local_workers(binds=['0.0.0.0:1']):
        pass
    port = workers_lib.portpicker.pick_unused_port()
    with runtime.local_workers(binds=[f'0.0.0.0:{port}'], allow_remote=True) as ws:
      self.assertTrue(ws[0].alive())
      self.assertTrue(rt.accepts(hosts[0], port))

  def test_no_compiler_is_one_clear_error(self):
    with tempfile.TemporaryDirectory() as cache, mock.patch.dict(
        os.environ, {'TFF_PARTIAL_CACHE_DIR': cache, 'CC': '', 'PATH': cache}):
      with self.assertRaisesRegex(runtime.WorkerError,
                                  'needs a C compiler .* would listen on every interface'):
        runtime.start_worker()

  def test_scripts_workers_binds_prints_workers_and_dies_with_its_parent(self):
    port = workers_lib.portpicker.pick_unused_port()
    proc = subprocess.Popen(
        [sys.executable, '-m', 'scripts.workers', f'--bind=127.0.0.1:{port}'],
        cwd=_ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
    try:
      self.assertEqual(proc.stdout.readline().strip(), f'--workers=127.0.0.1:{port}')
      worker_pids = [c.pid for c in psutil.Process(proc.pid).children()]
      self.assertLen(worker_pids, 1)
      self.assertTrue(rt.accepts('127.0.0.1', port))
      proc.send_signal(signal.SIGKILL)
      self.assertEqual(proc.wait(timeout=30), -signal.SIGKILL)
      self.assertTrue(_gone(worker_pids[0]), 'worker outlived scripts.workers')
    finally:
      proc.kill()
      proc.wait()


def _federated_sum(values):
  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def total(x):
    return tff.federated_sum(x)
  return total(values)


def _gone(pid: int, timeout_s: float = 20.0) -> bool:
  """Waits for process `pid` to end (a zombie counts as ended)."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    try:
      if psutil.Process(pid).status() == 'zombie':
        return True
    except psutil.NoSuchProcess:
      return True
    time.sleep(0.1)
  return False


def _kill_tffs_own_workers():
  """Stops the worker of TFF's own local context (only its `__del__` does)."""
  runtime.configure(None)
  gc.collect()  # TFF's ServiceManager.__del__ stops its worker
  ours = {w.process.pid for w in workers_lib._started}  # pylint: disable=protected-access
  for child in psutil.Process().children():
    if child.name().startswith('worker_binary') and child.pid not in ours:
      child.kill()
      child.wait()


if __name__ == '__main__':
  absltest.main()
