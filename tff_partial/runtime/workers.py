"""Local TFF C++ workers: start N `worker_binary` processes on loopback ports.

TFF's wheel ships its C++ executor service as `tensorflow_federated/data/
worker_binary`; TFF's own local context starts one on a free port and talks to
it over gRPC. Started several times, the same binary is TFF's distributed
runtime (see `tff_partial.runtime.contexts`). TFF has no helper that starts
several and stops them again, so this small one is written here.

    with workers.local_workers(2) as addresses:   # ['127.0.0.1:PORT', ...]
      contexts.configure(addresses)
      ...
"""

import contextlib
import dataclasses
import os
import signal
import subprocess
import time
from typing import Iterator, Optional, Sequence

import grpc
import portpicker
import tensorflow_federated as tff

_LOOPBACK_HOSTS = ('127.0.0.1', 'localhost', '[::1]', '::1')


class WorkerError(RuntimeError):
  """A TFF worker cannot be started, reached, or died during a computation."""


def worker_binary_path() -> str:
  """Path of the C++ `worker_binary` inside the installed TFF wheel."""
  path = os.path.join(os.path.dirname(tff.__file__), 'data', 'worker_binary')
  if not os.path.isfile(path):
    raise WorkerError(
        f'TFF worker binary not found at {path}; it ships in the '
        'tensorflow-federated wheel (reinstall it from requirements.lock)')
  return path


def split_address(address: str) -> tuple[str, int]:
  """('host', port) of 'host:port'; only loopback hosts are accepted."""
  host, sep, port = address.rpartition(':')
  if not sep or not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError(
        f'--workers: {address!r} is not host:port (e.g. 127.0.0.1:10001)')
  if host not in _LOOPBACK_HOSTS:
    raise ValueError(
        f'--workers: {address!r} is not a loopback address; only '
        f'{", ".join(_LOOPBACK_HOSTS)} are allowed')
  return host, int(port)


def wait_until_ready(addresses: Sequence[str], timeout_s: float = 60.0) -> None:
  """Blocks until every worker accepts gRPC connections, or raises WorkerError."""
  deadline = time.monotonic() + timeout_s
  for address in addresses:
    split_address(address)
    channel = grpc.insecure_channel(address)
    try:
      grpc.channel_ready_future(channel).result(
          timeout=max(0.1, deadline - time.monotonic()))
    except grpc.FutureTimeoutError as e:
      raise WorkerError(
          f'TFF worker at {address} did not become reachable within '
          f'{timeout_s:.0f}s') from e
    finally:
      channel.close()


@dataclasses.dataclass
class LocalWorker:
  """One running `worker_binary` process."""

  address: str
  process: subprocess.Popen

  def alive(self) -> bool:
    return self.process.poll() is None

  def kill(self) -> None:
    """Kills the worker abruptly (SIGKILL), as a crash would."""
    if self.alive():
      self.process.kill()
      self.process.wait()

  def stop(self, timeout_s: float = 10.0) -> None:
    """Stops the worker: SIGINT, then SIGKILL after `timeout_s`."""
    if not self.alive():
      return
    self.process.send_signal(signal.SIGINT)
    try:
      self.process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      self.process.kill()
      self.process.wait()


def start_worker(port: Optional[int] = None,
                 max_concurrent_computation_calls: int = -1,
                 log_path: Optional[str] = None) -> LocalWorker:
  """Starts one `worker_binary` on `port` (default: a free port)."""
  port = port or portpicker.pick_unused_port()
  args = [
      worker_binary_path(),
      f'--port={port}',
      f'--max_concurrent_computation_calls={max_concurrent_computation_calls}',
  ]
  out = open(log_path, 'ab') if log_path else subprocess.DEVNULL  # pylint: disable=consider-using-with
  env = dict(os.environ)
  env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  try:
    process = subprocess.Popen(args, stdout=out, stderr=out, env=env)
  finally:
    if log_path:
      out.close()
  return LocalWorker(address=f'127.0.0.1:{port}', process=process)


class LocalWorkers(list):
  """The `LocalWorker`s of `local_workers`; `.addresses` for `configure`."""

  @property
  def addresses(self) -> list[str]:
    return [w.address for w in self]


@contextlib.contextmanager
def local_workers(num_workers: int,
                  ready_timeout_s: float = 60.0,
                  log_dir: Optional[str] = None) -> Iterator[LocalWorkers]:
  """Starts `num_workers` local TFF workers on free loopback ports.

  Yields a `LocalWorkers` list (`.addresses` gives 'host:port' strings); the
  workers are stopped on exit, whatever happens inside.
  """
  if num_workers < 1:
    raise ValueError(f'num_workers={num_workers} must be >= 1')
  started = LocalWorkers()
  try:
    for i in range(num_workers):
      log_path = os.path.join(log_dir, f'worker_{i}.log') if log_dir else None
      started.append(start_worker(log_path=log_path))
    for worker in started:
      if not worker.alive():
        raise WorkerError(
            f'TFF worker {worker.address} exited at start with code '
            f'{worker.process.returncode}')
    wait_until_ready(started.addresses, ready_timeout_s)
    yield started
  finally:
    for worker in started:
      worker.stop()
