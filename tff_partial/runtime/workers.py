"""TFF C++ workers: start `worker_binary` processes bound to one address.

TFF's wheel ships its C++ executor service as `tensorflow_federated/data/
worker_binary`; TFF's own local context starts one on a free port and talks to
it over gRPC. Started several times, the same binary is TFF's distributed
runtime (see `tff_partial.runtime.contexts`). TFF has no helper that starts
several and stops them again, so this small one is written here.

Exposure. A worker runs any TensorFlow graph it is sent, file I/O included,
over plaintext, unauthenticated gRPC: whoever can connect to it can run code
as the user. TFF's binary listens on every interface; every worker started
here listens on 127.0.0.1 only (`bind_shim`), unless the caller passes another
`bind_host` explicitly. After start, the worker's listening sockets are read
back from /proc and a worker listening anywhere else is killed.

Lifetime. Workers are children of this process that die with it: the kernel
SIGKILLs them when this process dies, even by SIGKILL (`PR_SET_PDEATHSIG`,
set by the shim; they are spawned from one long-lived thread, because the
signal follows the thread that forked), and an exit handler stops the ones
still running at a normal exit.

    with workers.local_workers(2) as ws:      # ws.addresses: ['127.0.0.1:P', ...]
      contexts.configure(ws.addresses)
      ...
"""

import atexit
import concurrent.futures
import contextlib
import dataclasses
import ipaddress
import os
import signal
import subprocess
import threading
import time
from typing import Iterator, Optional, Sequence

import grpc
import portpicker
import tensorflow_federated as tff

from tff_partial.runtime import bind_shim

LOOPBACK = '127.0.0.1'
_GRPC_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000  # as TFF's own channels
GRPC_OPTIONS = [
    ('grpc.max_message_length', _GRPC_MAX_MESSAGE_BYTES),
    ('grpc.max_receive_message_length', _GRPC_MAX_MESSAGE_BYTES),
    ('grpc.max_send_message_length', _GRPC_MAX_MESSAGE_BYTES),
]
_ANY_HOSTS = ('0.0.0.0', '::')

# One line, shown wherever a remote address is refused or allowed.
REMOTE_RISK = (
    'TFF workers speak plaintext, unauthenticated gRPC and run any TensorFlow '
    'graph they are sent (file I/O included), so anyone who can reach a '
    "worker's port can run code as its user")


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


def is_loopback(host: str) -> bool:
  """Whether `host` (name, IPv4, or IPv6 with or without brackets) is loopback."""
  host = host.strip('[]')
  if host == 'localhost':
    return True
  try:
    return ipaddress.ip_address(host).is_loopback
  except ValueError:
    return False


def split_address(address: str, allow_remote: bool = False,
                  flag: str = '--workers') -> tuple[str, int]:
  """('host', port) of 'host:port' ('[v6]:port' for IPv6 literals).

  A host that is not loopback is refused unless `allow_remote`, with one line
  naming `--allow_remote_workers` and the reason.
  """
  host, sep, port = address.rpartition(':')
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError(
        f'{flag}: {address!r} is not host:port (e.g. 127.0.0.1:10001)')
  if not allow_remote and not is_loopback(host):
    raise ValueError(
        f'{flag}: {address!r} is not a loopback address; non-loopback '
        f'addresses need --allow_remote_workers, because {REMOTE_RISK} '
        '(safe set-ups: docs/distributed.md)')
  return host, int(port)


def wait_until_ready(addresses: Sequence[str], timeout_s: float = 60.0,
                     allow_remote: bool = False) -> None:
  """Blocks until every worker accepts gRPC connections, or raises WorkerError."""
  deadline = time.monotonic() + timeout_s
  for address in addresses:
    split_address(address, allow_remote=allow_remote)
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


def _proc_address(hex_address: str) -> ipaddress._BaseAddress:
  """An address of /proc/net/tcp{,6} (little-endian 32-bit words)."""
  raw = bytes.fromhex(hex_address)
  raw = b''.join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
  address = ipaddress.ip_address(raw)
  if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
    return address.ipv4_mapped
  return address


def listening_addresses(pid: int, port: int) -> set:
  """Addresses on which process `pid` listens on TCP `port` (from /proc).

  Reads the socket tables of the process's own network namespace
  (/proc/PID/net/tcp, tcp6) and keeps the listening sockets that the process
  holds open. '0.0.0.0' / '::' mean every interface.
  """
  inodes = set()
  fd_dir = f'/proc/{pid}/fd'
  try:
    fds = os.listdir(fd_dir)
  except OSError:  # the process has exited
    return set()
  for fd in fds:
    try:
      target = os.readlink(os.path.join(fd_dir, fd))
    except OSError:
      continue
    if target.startswith('socket:['):
      inodes.add(target[8:-1])
  found = set()
  for table in ('tcp', 'tcp6'):
    try:
      with open(f'/proc/{pid}/net/{table}') as f:
        lines = f.readlines()[1:]
    except OSError:  # no IPv6 in this kernel, or the process has exited
      continue
    for line in lines:
      fields = line.split()
      local, state, inode = fields[1], fields[3], fields[9]
      hex_address, hex_port = local.split(':')
      if state == '0A' and int(hex_port, 16) == port and inode in inodes:
        found.add(str(_proc_address(hex_address)))
  return found


def _status_bytes(pid: int, field: str) -> int:
  """A size field (kB) of /proc/PID/status, in bytes."""
  with open(f'/proc/{pid}/status') as f:
    for line in f:
      if line.startswith(f'{field}:'):
        return int(line.split()[1]) * 1024
  raise WorkerError(f'no {field} for process {pid}')


def peak_rss_bytes(pid: int) -> int:
  """Peak resident set size of process `pid` (VmHWM of /proc/PID/status)."""
  return _status_bytes(pid, 'VmHWM')


def rss_bytes(pid: int) -> int:
  """Resident set size of process `pid` now (VmRSS of /proc/PID/status)."""
  return _status_bytes(pid, 'VmRSS')


def reset_peak_rss(pid: int) -> None:
  """Resets VmHWM of `pid` to its current RSS (Linux: '5' > clear_refs)."""
  with open(f'/proc/{pid}/clear_refs', 'w') as f:
    f.write('5')


@dataclasses.dataclass
class LocalWorker:
  """One running `worker_binary` process, started by this process."""

  address: str  # where to connect, 'host:port'
  bind_host: str  # where it listens ('0.0.0.0' / '::': every interface)
  port: int
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
      self.kill()

  def peak_rss_bytes(self) -> int:
    """Peak resident memory of the worker (VmHWM) since start or last reset."""
    return peak_rss_bytes(self.process.pid)

  def reset_peak_rss(self) -> None:
    reset_peak_rss(self.process.pid)

  def rss_bytes(self) -> int:
    """Resident memory of the worker now (VmRSS)."""
    return rss_bytes(self.process.pid)

  def wait_ready(self, timeout_s: float = 60.0) -> None:
    """Waits until the worker answers, then checks where it listens.

    Raises:
      WorkerError: it exited, did not answer in time, or listens on an
        address other than `bind_host` (it is killed then).
    """
    deadline = time.monotonic() + timeout_s
    while self.alive() and not listening_addresses(self.process.pid, self.port):
      if time.monotonic() > deadline:
        break
      time.sleep(0.05)
    if not self.alive():
      raise WorkerError(
          f'TFF worker {self.address} exited at start with code '
          f'{self.process.returncode} (port {self.port} already in use, or '
          f'{self.bind_host} is not an address of this host?)')
    wait_until_ready([self.address], max(0.1, deadline - time.monotonic()),
                     allow_remote=True)
    listening = listening_addresses(self.process.pid, self.port)
    expected = ({self.bind_host} if self.bind_host not in _ANY_HOSTS
                else set(_ANY_HOSTS))  # gRPC's dual-stack '::' or '0.0.0.0'
    if not listening or not listening <= expected:
      self.kill()
      raise WorkerError(
          f'TFF worker on port {self.port} listened on {sorted(listening)}, '
          f'not only on {self.bind_host}; killed it (is LD_PRELOAD honoured? '
          'see tff_partial/runtime/bind_shim.py)')


# Every worker is forked by this one thread: PR_SET_PDEATHSIG fires when the
# *thread* that forked a child exits, so forking from a short-lived thread
# (e.g. the event-loop thread of a TFF context that is later replaced) would
# kill the worker early. The pool's thread lives until interpreter exit.
_spawner = concurrent.futures.ThreadPoolExecutor(
    max_workers=1, thread_name_prefix='tff_partial_worker_spawner')
_started: list = []
_started_lock = threading.Lock()


def start_worker(port: Optional[int] = None,
                 bind_host: str = LOOPBACK,
                 max_concurrent_computation_calls: int = -1,
                 log_path: Optional[str] = None,
                 launcher: Sequence[str] = (),
                 intra_op_threads: Optional[int] = None) -> LocalWorker:
  """Starts one `worker_binary` listening on `bind_host`:`port`.

  Args:
    port: the port (default: a free one).
    bind_host: an IP address of this host (or of the network namespace that
      `launcher` enters) to listen on; default loopback. '0.0.0.0' or '::'
      listens on every interface, as TFF's own worker does: expose a worker
      only on a network you trust (`REMOTE_RISK`).
    max_concurrent_computation_calls: the worker's flag (TFF's default -1:
      no limit).
    log_path: file for the worker's stdout and stderr (default: discarded;
      never this process's stdout, so a pipe reading it is not held open).
    launcher: argv prefix, e.g. ('ip', 'netns', 'exec', 'ns1'); it must exec
      the worker in the same process (as `ip netns exec` does).
    intra_op_threads: threads of TensorFlow's intra-op pool in the worker
      (`TF_NUM_INTRAOP_THREADS`; default: TensorFlow's, one per core).

  Returns:
    The started worker; call `wait_ready` before use.
  """
  if bind_host == 'localhost':
    bind_host = LOOPBACK
  try:
    bind_host = str(ipaddress.ip_address(bind_host.strip('[]')))
  except ValueError:
    raise ValueError(f'bind host {bind_host!r} is not an IP address') from None
  port = port or portpicker.pick_unused_port()
  args = [*launcher, worker_binary_path(), f'--port={port}',
          f'--max_concurrent_computation_calls={max_concurrent_computation_calls}']
  env = dict(os.environ)
  env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  if intra_op_threads is not None:
    env['TF_NUM_INTRAOP_THREADS'] = str(int(intra_op_threads))
  try:
    shim_env = bind_shim.worker_environment(
        None if bind_host in _ANY_HOSTS else bind_host, port, os.getpid())
  except bind_shim.ShimError as e:
    raise WorkerError(str(e)) from None
  if env.get('LD_PRELOAD'):
    shim_env['LD_PRELOAD'] += ':' + env['LD_PRELOAD']
  env.update(shim_env)
  out = open(log_path, 'ab') if log_path else subprocess.DEVNULL  # pylint: disable=consider-using-with
  try:
    process = _spawner.submit(
        subprocess.Popen, args, stdin=subprocess.DEVNULL, stdout=out,
        stderr=out, env=env).result()
  finally:
    if log_path:
      out.close()
  host = LOOPBACK if bind_host in _ANY_HOSTS else bind_host
  host = f'[{host}]' if ':' in host else host
  worker = LocalWorker(address=f'{host}:{port}', bind_host=bind_host,
                       port=port, process=process)
  with _started_lock:
    _started[:] = [w for w in _started if w.alive()]
    _started.append(worker)
  return worker


def _kill_started_workers() -> None:
  """Exit handler: kills the workers this process started that still run."""
  with _started_lock:
    for worker in _started:
      try:
        worker.kill()
      except OSError:
        pass
    _started.clear()


atexit.register(_kill_started_workers)


class LocalWorkers(list):
  """The `LocalWorker`s of `local_workers`; `.addresses` for `configure`."""

  @property
  def addresses(self) -> list[str]:
    return [w.address for w in self]


@contextlib.contextmanager
def local_workers(num_workers: int = 0,
                  ready_timeout_s: float = 60.0,
                  log_dir: Optional[str] = None,
                  binds: Sequence[str] = (),
                  allow_remote: bool = False,
                  max_concurrent_computation_calls: int = -1,
                  ) -> Iterator[LocalWorkers]:
  """Starts local TFF workers: `num_workers` on free loopback ports, or one per bind.

  Args:
    num_workers: workers to start on 127.0.0.1 and free ports.
    ready_timeout_s: how long to wait for each to answer.
    log_dir: directory for `worker_<i>.log` files (default: logs discarded).
    binds: instead of `num_workers`, 'host:port' to listen on, one worker
      each; a host that is not loopback needs `allow_remote`.
    allow_remote: allow binds on non-loopback addresses (`REMOTE_RISK`).
    max_concurrent_computation_calls: the workers' flag.

  Yields:
    A `LocalWorkers` list (`.addresses` gives 'host:port' strings); the
    workers are stopped on exit, whatever happens inside.
  """
  if bool(num_workers) == bool(binds):
    raise ValueError('give either num_workers >= 1 or binds')
  if num_workers < 0:
    raise ValueError(f'num_workers={num_workers} must be >= 1')
  targets = ([split_address(b, allow_remote=allow_remote, flag='--bind')
              for b in binds] or [(LOOPBACK, None)] * num_workers)
  started = LocalWorkers()
  try:
    for i, (host, port) in enumerate(targets):
      log_path = os.path.join(log_dir, f'worker_{i}.log') if log_dir else None
      started.append(start_worker(
          port=port, bind_host=host, log_path=log_path,
          max_concurrent_computation_calls=max_concurrent_computation_calls))
    for worker in started:
      worker.wait_ready(ready_timeout_s)
    yield started
  finally:
    for worker in started:
      worker.stop()
