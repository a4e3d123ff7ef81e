"""TFF's local C++ runtime, with its worker on loopback and tied to this process.

TFF sets its local C++ context as the default when `tensorflow_federated` is
imported (`tff.backends.native.set_sync_local_cpp_execution_context`). Its
worker (`executor_factory.local_cpp_executor_factory`):
* listens on every interface, although only this process connects to it;
* writes to this process's stdout and stderr;
* is stopped only by `ServiceManager.__del__`, which fails at interpreter
  shutdown ("'NoneType' object has no attribute 'Popen'"). So every program
  that ran a computation leaves an orphan worker, and the orphan keeps the
  program's stdout open: `python prog.py | tail` never returns.

`create_local_context` builds the same context (TFF's `RemoteExecutor` on one
`worker_binary`, TFF's native compiler and TensorFlow argument transforms,
TFF's `ResourceManagingExecutorFactory`), so every computation runs exactly
as on TFF's local runtime; only the worker differs: it is started by
`workers.start_worker`, i.e. on 127.0.0.1, with its output discarded, killed
by the kernel when this process dies (even by SIGKILL) and stopped at exit.
Like TFF's, it is started on first use and restarted when it has died.

Importing `tff_partial` calls `install_if_tff_default()`, which replaces
TFF's local C++ context (the one TFF sets when imported) with this one and
leaves any other context the user set alone. `tff.backends.native.set_sync_local_cpp_execution_context()`
brings TFF's own back.
"""

import math
import os
import threading
from typing import Optional

import grpc
import tensorflow_federated as tff
from tensorflow_federated.python.core.backends.native import compiler
from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
from tensorflow_federated.python.core.impl.execution_contexts import sync_execution_context
from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks
from tensorflow_federated.python.core.impl.executors import remote_executor
from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub

from tff_partial.runtime import workers as workers_lib

# How TFF's own import-time context is recognized (its executor stack
# function), so that a context the user set is never replaced.
_TFF_LOCAL_STACK_FN = 'local_cpp_executor_factory.<locals>.stack_fn'


# --local_client_parallelism: how the local worker shares this machine's
# cores among the clients of a round.
AUTO = 'auto'
TFF_DEFAULT = 'tff'


def available_cores() -> int:
  """CPU cores this process may run on."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


def client_parallelism(choice: str, cores: Optional[int] = None) -> tuple[int, Optional[int]]:
  """(clients trained at once, TensorFlow intra-op threads) of the local worker.

  Args:
    choice: `auto` (the default): one client per core with one TensorFlow
      intra-op thread each, whatever the cohort. Multi-threaded kernels
      round differently with the number of threads (emnist_cnn, 10 clients,
      3 rounds: weights apart by up to 0.014 between 1 and 2 threads), so
      one thread per client is what makes a run's numbers the same on
      machines with different core counts (tests/determinism_test.py); it is
      also the fastest setting measured for 10 clients on 2 cores. Its cost:
      cores idle when a round's clients do not fill them (3 clients of the
      ResNet-18 on 2 cores, the third training alone: 1.2x slower than TFF's
      default). `tff`: TFF's default worker (every client of the round at
      once, sharing one intra-op pool of one thread per core: (-1, None));
      its rounding depends on the core count. A positive integer N: N
      clients at once, cores // N threads each.
    cores: default `available_cores()`.

  Written here: TFF's worker takes `--max_concurrent_computation_calls`, and
  TensorFlow reads `TF_NUM_INTRAOP_THREADS`, but nothing picks them.
  `scripts.benchmark` measured the settings on emnist_cnn_gn with 10 clients
  on 2 cores (docs/benchmarks.md).

  Raises:
    ValueError: `choice` is none of these.
  """
  cores = cores or available_cores()
  if choice == TFF_DEFAULT:
    return -1, None
  if choice == AUTO:
    return cores, 1
  try:
    at_once = int(choice)
  except ValueError:
    at_once = 0
  if at_once < 1:
    raise ValueError(f'--local_client_parallelism={choice!r}; valid values: '
                     f'{AUTO}, {TFF_DEFAULT} or a positive integer')
  return at_once, max(1, cores // at_once)


class _LocalService:
  """The local runtime's one worker: started on first use, restarted if dead."""

  def __init__(self, max_concurrent_computation_calls: int,
               ready_timeout_s: float, intra_op_threads: Optional[int] = None):
    self._max_calls = max_concurrent_computation_calls
    self._intra_op_threads = intra_op_threads
    self._ready_timeout_s = ready_timeout_s
    self._lock = threading.Lock()
    self.worker = None
    self._stub = None

  def stub(self) -> remote_executor_grpc_stub.RemoteExecutorGrpcStub:
    with self._lock:
      if self._stub is not None and self.worker.alive() and self._stub.is_ready:
        return self._stub
      if self.worker is not None:
        self.worker.stop()
      worker = workers_lib.start_worker(
          max_concurrent_computation_calls=self._max_calls,
          intra_op_threads=self._intra_op_threads)
      worker.wait_ready(self._ready_timeout_s)
      self.worker = worker
      self._stub = remote_executor_grpc_stub.RemoteExecutorGrpcStub(
          grpc.insecure_channel(worker.address, workers_lib.GRPC_OPTIONS))
      return self._stub

  def stop(self) -> None:
    """Stops the worker; the next `stub()` starts a fresh one."""
    with self._lock:
      if self.worker is not None:
        self.worker.stop()
      self.worker = None
      self._stub = None


class LocalContext(sync_execution_context.SyncExecutionContext):
  """TFF's synchronous local C++ context on a worker of `workers.start_worker`.

  `.worker` is the running `workers.LocalWorker` (None before first use).
  `max_concurrent_computation_calls` (-1: no limit) and `intra_op_threads`
  (None: TensorFlow's default) are the worker's (`client_parallelism`).
  """

  def __init__(self, default_num_clients: int = 0,
               max_concurrent_computation_calls: int = -1,
               ready_timeout_s: float = 60.0,
               intra_op_threads: Optional[int] = None):
    self._service = _LocalService(max_concurrent_computation_calls,
                                  ready_timeout_s, intra_op_threads)

    # The cardinalities of the executors built so far (`restart_worker`
    # closes them: TFF's factory closes one given its cardinalities, and has
    # no call to close all).
    self._cardinalities = []

    def stack_fn(cardinalities):
      if cardinalities.get(tff.CLIENTS) is None:
        cardinalities[tff.CLIENTS] = default_num_clients
      if cardinalities not in self._cardinalities:
        self._cardinalities.append(dict(cardinalities))
      executor = remote_executor.RemoteExecutor(self._service.stub())
      executor.set_cardinalities(cardinalities)
      return executor

    super().__init__(
        executor_fn=python_executor_stacks.ResourceManagingExecutorFactory(
            executor_stack_fn=stack_fn),
        compiler_fn=compiler.desugar_and_transform_to_native,
        transform_args=tensorflow_computation.transform_args,
        transform_result=tensorflow_computation.transform_result)

  @property
  def worker(self):
    return self._service.worker

  def restart_worker(self) -> None:
    """Stops the worker; the next computation runs on a fresh one.

    Why: TFF's `worker_binary` grows over a long run and never gives the
    memory back. Measured (shakespeare_word, 20 clients a round, DP-FTRL):
    5-10 MB a round, 0.75 to 2.7 GB over 400 rounds. Not found why (issue 16,
    docs/architecture.md); glibc settings (`MALLOC_ARENA_MAX=2`, a fixed
    `MALLOC_MMAP_THRESHOLD_`) slowed it by a quarter to a half, no more. The
    worker keeps no state between computations that changes their results (every
    value comes from this process each call, as when a run resumes in a new
    process: tests/determinism_test.py), so a restart costs only the
    worker's start and the first call's setup of each computation (a
    shakespeare_word round took 19.6 s after a restart, 8 s before).
    """
    for cardinalities in self._cardinalities:
      self.executor_factory.clean_up_executor(dict(cardinalities))
    self._service.stop()


# --local_worker_restart_mb's default: the training loop restarts the local
# worker (`restart_local_worker`) once it has grown by this many MB since the
# loop first measured it.
DEFAULT_WORKER_RESTART_MB = 1024


def local_worker_rss_mb() -> float:
  """Resident memory (MB) of the current `LocalContext`'s worker; NaN if none."""
  context = context_stack_impl.context_stack.current
  worker = context.worker if isinstance(context, LocalContext) else None
  if worker is None or not worker.alive():
    return math.nan
  try:
    return worker.rss_bytes() / 2**20
  except (OSError, workers_lib.WorkerError):  # it exited meanwhile
    return math.nan


def restart_local_worker() -> bool:
  """Restarts the worker of the current context if it is a running `LocalContext`.

  Returns whether it did. Other contexts (workers of `--workers`, which this
  process did not start; a context the user set) are left alone.
  """
  context = context_stack_impl.context_stack.current
  if not isinstance(context, LocalContext) or context.worker is None:
    return False
  context.restart_worker()
  return True


def _kill_tffs_worker(context) -> None:
  """Kills the worker of TFF's own local context, if it started one.

  TFF's `ServiceManager.__del__` (run when the context is dropped) stops its
  worker with SIGINT and then waits for it. A worker that inherited SIGINT
  ignored (started by a background job of a non-interactive shell, or under
  pytest-xdist) never exits, and the wait hangs the program. Killed first,
  the worker is gone and the wait returns at once. Written here: TFF keeps
  the process in a closure of its executor stack function.
  """
  for cell in getattr(_stack_fn(context), '__closure__', None) or ():
    try:
      process = getattr(cell.cell_contents, '_process', None)
    except ValueError:  # an empty cell
      continue
    if process is not None and process.poll() is None:
      process.kill()  # reaped by TFF's own wait


def install(max_concurrent_computation_calls: int = -1,
            intra_op_threads: Optional[int] = None) -> LocalContext:
  """Sets a new `LocalContext` as TFF's default context and returns it.

  The worker of a `LocalContext` it replaces is stopped, and so is that of
  TFF's own local context (`_kill_tffs_worker`). The new one starts its
  worker at first use, with the environment of then (e.g.
  `TF_DETERMINISTIC_OPS`, which the worker reads once).
  """
  previous = context_stack_impl.context_stack.current
  if _is_tff_local_default(previous):
    _kill_tffs_worker(previous)
  context = LocalContext(
      max_concurrent_computation_calls=max_concurrent_computation_calls,
      intra_op_threads=intra_op_threads)
  tff.framework.set_default_context(context)
  if isinstance(previous, LocalContext) and previous.worker is not None:
    previous.worker.stop()
  return context


def _stack_fn(context):
  """The executor stack function of a TFF execution context (None if none)."""
  factory = getattr(context, 'executor_factory', None)
  return getattr(factory, '_executor_stack_fn', None)


def _is_tff_local_default(context) -> bool:
  return getattr(_stack_fn(context), '__qualname__', None) == _TFF_LOCAL_STACK_FN


def install_if_tff_default() -> bool:
  """Replaces TFF's own import-time local context by a `LocalContext`.

  Returns whether it did; any other default context (one the user set) is
  kept.
  """
  if _is_tff_local_default(context_stack_impl.context_stack.current):
    install()
    return True
  return False
