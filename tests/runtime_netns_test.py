"""Rounds over TFF workers on two other "hosts": Linux network namespaces.

Each host is a network namespace joined to the test's namespace by a veth
pair, with addresses of the test's own in 10.200.X.0/24 (X free on this
machine, random per run so that parallel runs do not clash). Only these
addresses are contacted. A worker runs in each namespace (`ip netns exec`),
listening on its namespace's address, and the test's coordinator reaches it
over the veth link as it would reach another machine.

Needs root and `ip` (iproute2); skips with the reason otherwise. Namespaces
are removed in every case (class cleanups), and namespaces left by a test
process that was killed are removed by the next run.
"""
# bazel: size=large

import asyncio
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from absl.testing import absltest
import numpy as np
import psutil
import tensorflow_federated as tff

from tests import runtime_testing as rt
from tff_partial import runtime
from tff_partial.runtime import workers as workers_lib

_PREFIX = 'tffp-'


def _ip(*args, check=True):
  return subprocess.run(['ip', *args], capture_output=True, text=True, check=check)


def _remove_stale_namespaces():
  """Deletes namespaces of earlier runs whose test process no longer exists."""
  for name in _ip('netns', 'list').stdout.split():
    match = re.fullmatch(_PREFIX + r'(\d+)-\w+', name)
    if match and not psutil.pid_exists(int(match.group(1))):
      _ip('netns', 'del', name, check=False)


def _free_subnet() -> int:
  used = _ip('-4', 'addr').stdout
  free = [x for x in range(256) if f'10.200.{x}.' not in used]
  return random.choice(free)


class Host:
  """A network namespace with one veth link to the test's namespace."""

  def __init__(self, name, link, host_address, own_address):
    self.name, self.link = name, link
    self.host_address, self.address = host_address, own_address

  def run(self, *args, **kwargs):
    return subprocess.run(['ip', 'netns', 'exec', self.name, *args], **kwargs)

  def start_worker(self, port=None):
    worker = workers_lib.start_worker(
        port=port, bind_host=self.address,
        launcher=('ip', 'netns', 'exec', self.name))
    worker.wait_ready(120)
    return worker


class NetnsTest(rt.RuntimeTestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    if os.geteuid() != 0:
      raise absltest.SkipTest('network namespaces need root')
    if shutil.which('ip') is None:
      raise absltest.SkipTest('network namespaces need `ip` (iproute2)')
    _remove_stale_namespaces()
    token = f'{os.getpid()}-{random.randrange(16**4):04x}'
    subnet = _free_subnet()
    cls.hosts = []
    for i, side in enumerate('ab'):
      name = f'{_PREFIX}{token}{side}'
      link = f'tp{token.split("-")[1]}{os.getpid() % 1000:03d}{side}'
      host_address = f'10.200.{subnet}.{4 * i + 1}'
      own_address = f'10.200.{subnet}.{4 * i + 2}'
      created = _ip('netns', 'add', name, check=False)
      if created.returncode != 0:
        raise absltest.SkipTest(f'ip netns add failed: {created.stderr.strip()}')
      cls.addClassCleanup(_ip, 'netns', 'del', name, check=False)
      cls.addClassCleanup(_ip, 'link', 'del', link, check=False)
      _ip('link', 'add', link, 'type', 'veth', 'peer', 'name', 'eth0',
          'netns', name)
      _ip('addr', 'add', f'{host_address}/30', 'dev', link)
      _ip('link', 'set', link, 'up')
      _ip('-n', name, 'addr', 'add', f'{own_address}/30', 'dev', 'eth0')
      _ip('-n', name, 'link', 'set', 'eth0', 'up')
      _ip('-n', name, 'link', 'set', 'lo', 'up')
      cls.hosts.append(Host(name, link, host_address, own_address))

  def _workers(self, *hosts):
    started = []
    for host in hosts:
      worker = host.start_worker()
      self.addCleanup(worker.kill)
      started.append(worker)
    return started

  def _local_result(self, rounds):
    runtime.configure(None)
    return rt.weights(self.process, self.train(rounds))

  def test_three_rounds_on_two_hosts_equal_the_local_runtime(self):
    expected = self._local_result(3)
    workers = self._workers(*self.hosts)
    for worker, host in zip(workers, self.hosts):
      self.assertEqual(
          workers_lib.listening_addresses(worker.process.pid, worker.port),
          {host.address})
    addresses = [w.address for w in workers]
    with self.assertRaisesRegex(ValueError, '--allow_remote_workers'):
      runtime.configure(addresses)
    runtime.configure(addresses, allow_remote=True)
    state = self.train(3)
    actual = rt.weights(self.process, state)
    self.assert_close(expected, actual)
    initial = rt.weights(self.process, self.process.initialize())
    self.assertGreater(np.max(np.abs(actual[0] - initial[0])), 1e-3)

  def test_host_killed_mid_round_fails_it_and_a_restart_resumes(self):
    expected = self._local_result(3)
    workers = self._workers(*self.hosts)
    addresses = [w.address for w in workers]
    timeout_s = 60.0
    runtime.configure(addresses, allow_remote=True, rpc_timeout_s=timeout_s)
    root = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, root, ignore_errors=True)
    checkpoints = tff.program.FileProgramStateManager(root)
    state = self.train(1)
    asyncio.run(checkpoints.save(state, 1))
    # Mid-round: host b's worker is frozen, round 2 starts and waits on it,
    # then the worker dies.
    victim = workers[1]
    os.kill(victim.process.pid, signal.SIGSTOP)
    errors = []
    context = tff.framework.get_context_stack().current

    def round_two():
      # TFF's context stack is per thread: this thread gets the same context.
      with tff.framework.get_context_stack().install(context):
        try:
          self.train(1, state)
        except runtime.WorkerError as e:
          errors.append(e)

    thread = threading.Thread(target=round_two, daemon=True)
    thread.start()
    thread.join(timeout=2.0)
    self.assertTrue(thread.is_alive(), 'round 2 did not wait on the frozen host')
    killed_at = time.monotonic()
    victim.kill()
    thread.join(timeout=timeout_s)
    self.assertFalse(thread.is_alive(), 'round 2 hung after its host died')
    self.assertLess(time.monotonic() - killed_at, timeout_s)
    self.assertLen(errors, 1)
    self.assertIn(f'TFF worker {victim.address} is unreachable', str(errors[0]))
    # Restart the host's worker on the same address, rerun from the checkpoint.
    restarted = self.hosts[1].start_worker(port=victim.port)
    self.addCleanup(restarted.kill)
    runtime.configure(addresses, allow_remote=True)
    restored, version = asyncio.run(
        checkpoints.load_latest(self.process.initialize()))
    self.assertEqual(version, 1)
    resumed = rt.weights(self.process, self.train(2, restored))
    self.assert_close(expected, resumed)

  def test_hung_host_fails_the_round_at_the_rpc_deadline(self):
    workers = self._workers(*self.hosts)
    timeout_s = 3.0
    runtime.configure([w.address for w in workers], allow_remote=True,
                      rpc_timeout_s=timeout_s)
    state = self.train(1)  # compiled and warm
    os.kill(workers[0].process.pid, signal.SIGSTOP)  # alive, never answers
    start = time.monotonic()
    with self.assertRaisesRegex(
        runtime.WorkerError,
        f'TFF worker {re.escape(workers[0].address)} did not answer .* within 3s'):
      self.train(1, state)
    self.assertGreaterEqual(time.monotonic() - start, timeout_s)

  def test_a_loopback_worker_is_unreachable_from_another_host(self):
    probe = ('import socket,sys\n'
             's=socket.socket(); s.settimeout(3)\n'
             'sys.exit(s.connect_ex((sys.argv[1], int(sys.argv[2]))))')
    other = self.hosts[0]

    def reachable(port):
      return other.run(sys.executable, '-c', probe, other.host_address, str(port),
                       capture_output=True).returncode == 0

    with runtime.local_workers(1) as ws:  # the default: loopback only
      self.assertFalse(reachable(ws[0].port))
    # Control: the same probe reaches a worker that listens on every interface.
    port = workers_lib.portpicker.pick_unused_port()
    with runtime.local_workers(binds=[f'0.0.0.0:{port}'], allow_remote=True):
      self.assertTrue(reachable(port))


if __name__ == '__main__':
  absltest.main()
