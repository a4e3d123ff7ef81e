"""A user's program that imports tff_partial leaves no TFF worker behind.

TFF 0.87's own local context starts its `worker_binary` with this program's
stdout and stops it only in a `__del__` that fails at interpreter shutdown, so
such a program leaves an orphan worker that keeps `prog | tail` waiting
forever. Importing `tff_partial` installs `tff_partial.runtime.local`'s
context instead; these tests run a user's program in a subprocess and check
that its worker ends with it, also when the program is killed by SIGKILL.
"""
# bazel: size=large

import os
import signal
import subprocess
import sys
import threading
import time

from absl.testing import absltest
import psutil

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The user's program: import the package, build a process with one of its
# builders, run one round on the local runtime, print the pids of its child
# processes; with 'wait', block until killed.
_PROGRAM = """
import sys
import psutil
import tensorflow as tf
import tensorflow_federated as tff
import tff_partial
from tff_partial import frozen
from tests import runtime_testing as rt

process = frozen.build_fedpt_process(
    rt.keras_model,
    lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    lambda: [], rt.INPUT_SPEC, frozen_layers=[],
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=0.5))
state = process.next(process.initialize(), rt.client_data()).state
print(' '.join(str(c.pid) for c in psutil.Process().children(recursive=True)),
      flush=True)
if sys.argv[1:] == ['wait']:
  sys.stdin.read()
"""


def _start(*args):
  return subprocess.Popen(
      [sys.executable, '-c', _PROGRAM, *args], cwd=_ROOT,
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))


def _ended(pid: int) -> bool:
  try:
    return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
  except psutil.NoSuchProcess:
    return True


def _wait_ended(pids, timeout_s: float = 30.0) -> list:
  """The pids still running after up to `timeout_s` seconds."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline and not all(_ended(p) for p in pids):
    time.sleep(0.1)
  return [p for p in pids if not _ended(p)]


def _kill(pids):
  for pid in pids:
    try:
      psutil.Process(pid).kill()
    except psutil.NoSuchProcess:
      pass


class StrayProcessesTest(absltest.TestCase):

  def test_finished_program_leaves_no_worker_and_closes_its_pipe(self):
    proc = _start()
    try:
      # As `prog | tail`: read stdout to its end. An orphan worker holding
      # the pipe would make this time out.
      out, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
      proc.kill()
      self.fail('stdout stayed open after the program ended: a child holds it')
    self.assertEqual(proc.returncode, 0)
    children = [int(p) for p in out.split()]
    self.assertNotEmpty(children)  # the local runtime's worker ran the round
    survivors = _wait_ended(children)
    self.addCleanup(_kill, survivors)
    self.assertEmpty(survivors, 'child processes outlived the program')

  def test_program_killed_by_sigkill_leaves_no_worker(self):
    proc = _start('wait')
    self.addCleanup(proc.wait)
    self.addCleanup(proc.kill)
    children = [int(p) for p in proc.stdout.readline().split()]
    self.assertNotEmpty(children)
    self.assertFalse(any(_ended(p) for p in children))
    proc.send_signal(signal.SIGKILL)
    self.assertEqual(proc.wait(timeout=30), -signal.SIGKILL)
    rest = []
    reader = threading.Thread(target=lambda: rest.append(proc.stdout.read()),
                              daemon=True)
    reader.start()
    reader.join(timeout=30)
    self.assertFalse(reader.is_alive(), 'stdout stayed open after SIGKILL')
    survivors = _wait_ended(children)
    self.addCleanup(_kill, survivors)
    self.assertEmpty(survivors, 'child processes outlived the killed program')


if __name__ == '__main__':
  absltest.main()
