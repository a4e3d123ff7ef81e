"""Execution contexts: TFF's local C++ runtime, or several TFF workers.

`configure(workers)` installs, as TFF's default context, a
`tff.backends.native.create_mergeable_comp_execution_context` over one
asynchronous context per worker address: each federated computation is
compiled to TFF's mergeable form (up-to-merge / merge / after-merge), the
clients of a round are split into one sub-round per worker, the workers run
their sub-rounds in parallel, and the partial aggregates are merged. For the
computations of this package's processes (`LearningProcess.next`: a broadcast,
client training, one weighted mean / sum per aggregate) this is the same
round as on one worker.

`configure([])` (or `configure(None)`) restores the local C++ runtime
(`tff_partial.runtime.local`: TFF's local context with its worker on loopback).

Addresses must be loopback unless `allow_remote=True`: TFF's workers speak
plaintext, unauthenticated gRPC and run any graph they are sent
(`workers.REMOTE_RISK`, docs/distributed.md).

Failure handling (written here, TFF has none for this): TFF's gRPC stub marks
UNAVAILABLE as retryable and its async context retries such errors forever,
so a dead worker would hang the round. The stub below gives every RPC a
deadline and turns gRPC failures into a non-retryable `WorkerError` that names
the worker, so the round fails at once with a clear message; the training
loop's checkpoints make the run resumable.
"""

import atexit
import math
from typing import Optional, Sequence

from absl import logging
import grpc
import psutil
import tensorflow_federated as tff
from tensorflow_federated.python.core.backends.native import compiler
from tensorflow_federated.python.core.backends.native import mergeable_comp_compiler
from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation
from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context
from tensorflow_federated.python.core.impl.execution_contexts import mergeable_comp_execution_context
from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks
from tensorflow_federated.python.core.impl.executors import cardinalities_utils
from tensorflow_federated.python.core.impl.executors import remote_executor
from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub

from tff_partial.runtime import local
from tff_partial.runtime import workers as workers_lib

WorkerError = workers_lib.WorkerError

DEFAULT_RPC_TIMEOUT_S = 600.0

_configured_workers: list[str] = []


class _DeadlineStub(remote_executor_grpc_stub.RemoteExecutorGrpcStub):
  """TFF's executor stub with a deadline per RPC and non-retryable failures."""

  def __init__(self, address: str, rpc_timeout_s: float):
    # A subchannel pool of this channel's own: gRPC shares connections to an
    # address between channels by default, so after a worker died, the stubs
    # of a new `configure` inherited its connection's reconnect backoff and
    # failed at once with 'Connection refused' even though a restarted worker
    # was already listening (seen in CI, runtime_netns_test).
    super().__init__(grpc.insecure_channel(
        address, workers_lib.GRPC_OPTIONS + [('grpc.use_local_subchannel_pool', 1)]))
    self._address = address
    self._timeout = rpc_timeout_s

  def _call(self, name, request):
    try:
      return getattr(self._stub, name)(request, timeout=self._timeout)
    except grpc.RpcError as e:
      code = e.code() if isinstance(e, grpc.Call) else None
      details = e.details() if isinstance(e, grpc.Call) else str(e)
      if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        why = f'did not answer {name} within {self._timeout:.0f}s'
      elif code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        why = 'is unreachable (did it die?)'
      else:
        why = f'failed {name}'
      raise WorkerError(
          f'TFF worker {self._address} {why}: {code} {details}. The round '
          'failed; restart the worker (or drop it from --workers) and rerun '
          'with the same flags to resume from the last checkpoint.') from None

  def get_executor(self, request):
    return self._call('GetExecutor', request)

  def create_value(self, request):
    return self._call('CreateValue', request)

  def create_struct(self, request):
    return self._call('CreateStruct', request)

  def create_call(self, request):
    return self._call('CreateCall', request)

  def create_selection(self, request):
    return self._call('CreateSelection', request)

  def compute(self, request):
    return self._call('Compute', request)

  def dispose(self, request):
    try:
      return self._call('Dispose', request)
    except WorkerError as e:  # cleanup after a failure must not mask it
      logging.warning('%s', e)
      return None

  def dispose_executor(self, request):
    try:
      return self._call('DisposeExecutor', request)
    except WorkerError as e:
      logging.warning('%s', e)
      return None


def _worker_context(address: str, rpc_timeout_s: float):
  """An async TFF context whose executor lives on the worker at `address`."""
  stub = _DeadlineStub(address, rpc_timeout_s)

  def stack_fn(cardinalities):
    if cardinalities.get(tff.CLIENTS) is None:
      cardinalities[tff.CLIENTS] = 0
    executor = remote_executor.RemoteExecutor(stub)
    executor.set_cardinalities(cardinalities)
    return executor

  return async_execution_context.AsyncExecutionContext(
      executor_fn=python_executor_stacks.ResourceManagingExecutorFactory(
          executor_stack_fn=stack_fn),
      compiler_fn=compiler.desugar_and_transform_to_native,
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result,
  )


class _BoundedSubroundContext(
    mergeable_comp_execution_context.MergeableCompExecutionContext):
  """TFF's mergeable context with at most `max_clients` clients per sub-round.

  TFF's context splits a call's clients into a fixed `num_subrounds` (default:
  one per worker); each context runs its sub-rounds one after another and the
  partial aggregates are merged. A worker holds its whole sub-round at once,
  so its memory grows with the cohort. Here the number of sub-rounds is chosen
  per call, ceil(clients / max_clients) and at least one per worker, which
  bounds what a worker holds whatever the cohort. (TFF reads the count from
  its private `_num_subrounds`; TFF is pinned to 0.87.)
  """

  def __init__(self, async_contexts, max_clients: int):
    super().__init__(
        async_contexts,
        compiler_fn=mergeable_comp_compiler.compile_to_mergeable_comp_form)
    if not hasattr(self, '_num_subrounds'):
      raise RuntimeError('this TFF version has no MergeableCompExecutionContext.'
                         '_num_subrounds; max_clients_per_subround needs 0.87')
    self._num_contexts = len(async_contexts)
    self._max_clients = max_clients

  def invoke(self, comp, arg=None):
    clients = 0
    if arg is not None:
      parameter = (comp.type_signature.parameter if hasattr(comp, 'type_signature')
                   else comp.up_to_merge.type_signature.parameter)
      clients = cardinalities_utils.infer_cardinalities(arg, parameter).get(
          tff.CLIENTS, 0)
    self._num_subrounds = max(self._num_contexts,
                              math.ceil(clients / self._max_clients))
    return super().invoke(comp, arg)


def create_context(workers: Sequence[str],
                   rpc_timeout_s: float = DEFAULT_RPC_TIMEOUT_S,
                   allow_remote: bool = False,
                   max_clients_per_subround: Optional[int] = None):
  """A TFF context spreading each round's clients over `workers` (host:port).

  `max_clients_per_subround`: None runs one sub-round per worker (TFF's
  default); K > 0 cuts each call into sub-rounds of at most K clients, run
  one after another on each worker, which bounds the workers' memory.
  """
  if not workers:
    raise ValueError('--workers: give at least one host:port')
  if rpc_timeout_s <= 0:
    raise ValueError(f'rpc_timeout_s={rpc_timeout_s} must be > 0')
  if max_clients_per_subround is not None and max_clients_per_subround < 1:
    raise ValueError(f'--worker_max_clients_per_subround={max_clients_per_subround} '
                     'must be >= 1')
  for address in workers:
    workers_lib.split_address(address, allow_remote=allow_remote)
  if len(set(workers)) != len(workers):
    raise ValueError(f'--workers: duplicate addresses in {list(workers)}')
  contexts = [_worker_context(a, rpc_timeout_s) for a in workers]
  if max_clients_per_subround is None:
    return tff.backends.native.create_mergeable_comp_execution_context(contexts)
  return _BoundedSubroundContext(contexts, max_clients_per_subround)


def _stop_local_runtime_workers() -> None:
  """Kills the `worker_binary` children of this process (TFF's own local context's).

  TFF's local C++ context stops its worker only in a `__del__` that does not
  run at interpreter exit, so every finished Python process leaves an orphan
  worker behind. `local.LocalContext` (the package's default) does not need
  this; it covers a program that set TFF's own context back.
  """
  for child in psutil.Process().children(recursive=True):
    try:
      if child.name().startswith('worker_binary'):
        child.kill()
    except psutil.Error:
      pass


_exit_cleanup_installed = False


def stop_local_workers_at_exit() -> None:
  """Registers (once) an exit handler that kills TFF's local worker processes."""
  global _exit_cleanup_installed
  if not _exit_cleanup_installed:
    atexit.register(_stop_local_runtime_workers)
    _exit_cleanup_installed = True


def configure(workers: Optional[Sequence[str]],
              rpc_timeout_s: float = DEFAULT_RPC_TIMEOUT_S,
              ready_timeout_s: float = 60.0,
              allow_remote: bool = False,
              max_clients_per_subround: Optional[int] = None,
              local_parallelism: tuple[int, Optional[int]] = (-1, None)) -> None:
  """Sets TFF's default context: several workers, or the local C++ runtime.

  Args:
    workers: 'host:port' of running TFF workers; empty or None restores the
      local C++ runtime (`local.LocalContext`, one loopback worker it starts
      itself).
    rpc_timeout_s: deadline of every call to a worker; a worker that does not
      answer in time fails the round with `WorkerError`.
    ready_timeout_s: how long to wait for the workers to accept connections.
    allow_remote: accept hosts that are not loopback (`workers.REMOTE_RISK`).
    max_clients_per_subround: bound on the clients a worker holds at once
      (`create_context`); None: one sub-round per worker.
    local_parallelism: the local runtime's (clients trained at once,
      intra-op threads) (`local.client_parallelism`); default TFF's.

  Raises:
    ValueError: an address is not host:port, is repeated, or is not loopback
      without `allow_remote`.
    WorkerError: a worker is not reachable.
  """
  global _configured_workers
  stop_local_workers_at_exit()
  if not workers:
    local.install(*local_parallelism)
    _configured_workers = []
    return
  workers = list(workers)
  context = create_context(workers, rpc_timeout_s, allow_remote=allow_remote,
                           max_clients_per_subround=max_clients_per_subround)
  workers_lib.wait_until_ready(workers, ready_timeout_s, allow_remote=allow_remote)
  tff.framework.set_default_context(context)
  _configured_workers = workers
  logging.info('TFF runtime: %d workers (%s)', len(workers), ', '.join(workers))


def configured_workers() -> list[str]:
  """The workers set by the last `configure` (empty: local runtime)."""
  return list(_configured_workers)
