"""TFF local worker settings a benchmark configuration can vary.

The clients of a round train in TFF's C++ `worker_binary`. Two of its
settings decide how a 2-core machine is shared among them:

* `worker_max_concurrent_calls`: the worker's
  `--max_concurrent_computation_calls` (TFF's default -1: every client of
  the round at once);
* `worker_intra_op_threads` / `worker_inter_op_threads`: the sizes of
  TensorFlow's thread pools in the worker (`TF_NUM_INTRAOP_THREADS` /
  `TF_NUM_INTEROP_THREADS`, read by TensorFlow when the worker starts;
  default: one per core each).

`local_context(...)` starts a local worker with those settings (this
process's own TensorFlow is not changed) and returns its TFF context; a
configuration that names any of them runs its rounds in that context
(`rounds` installs it around each round).
"""

from typing import Optional

import numpy as np
import tensorflow_federated as tff

from tff_partial.measure import memory
from tff_partial.runtime import local

KEYS = ('worker_max_concurrent_calls', 'worker_intra_op_threads',
        'worker_inter_op_threads')
_INTER_OP_ENV = 'TF_NUM_INTEROP_THREADS'  # read by TensorFlow at worker start


def split(overrides: dict) -> tuple[dict, dict]:
  """(worker settings as ints, the other overrides); ValueError if not ints."""
  settings, rest = {}, {}
  for key, value in overrides.items():
    if key in KEYS:
      try:
        settings[key] = int(value)
      except (TypeError, ValueError):
        raise ValueError(f'{key}={value!r} is not an integer') from None
    else:
      rest[key] = value
  return settings, rest


@tff.tensorflow.computation(np.int32)
def _noop(x):
  return x


def local_context(worker_max_concurrent_calls: int = -1,
                  worker_intra_op_threads: Optional[int] = None,
                  worker_inter_op_threads: Optional[int] = None):
  """A synchronous TFF context on a new local worker with these settings."""
  # This package's local context (tff_partial.runtime.local): TFF's own one
  # stops its worker at exit by SIGINT and waits, and a worker_binary that
  # ignores it hangs the benchmark at exit (seen with several workers).
  context = local.LocalContext(
      max_concurrent_computation_calls=worker_max_concurrent_calls,
      intra_op_threads=worker_intra_op_threads)
  env = {}
  if worker_inter_op_threads is not None:
    env[_INTER_OP_ENV] = str(worker_inter_op_threads)
  with memory.temporary_environ(env):
    # TFF starts the worker on the first call; it inherits this environment.
    with tff.framework.get_context_stack().install(context):
      _noop(0)
  return context


def describe(settings: dict) -> str:
  if not settings:
    return 'default worker'
  return ', '.join(f'{k}={v}' for k, v in sorted(settings.items()))
