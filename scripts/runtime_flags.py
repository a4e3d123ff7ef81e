"""--workers: run rounds on several TFF C++ workers (tff_partial.runtime).

`scripts.train` (and any binary) imports this module for its flags and calls
`configure_from_flags()` once before building processes:

  --workers=127.0.0.1:10001,127.0.0.1:10002   clients spread over these workers
  --workers=                                  (default) TFF's local C++ runtime

Start workers with `python -m scripts.workers --num_workers=2` (prints the
--workers value) or `tff_partial.runtime.local_workers(n)` in Python.
"""

from absl import flags

from scripts import flag_groups
from tff_partial import runtime

WORKERS = flags.DEFINE_list(
    'workers', [],
    'Comma-separated loopback host:port of running TFF worker_binary '
    'processes; each round\'s clients are spread over them. Empty: TFF\'s '
    'local C++ runtime.')
WORKER_RPC_TIMEOUT_S = flags.DEFINE_float(
    'worker_rpc_timeout_s', 600.0,
    'Deadline in seconds of every call to a worker; a worker that dies or '
    'does not answer in time fails the round with a clear error (rerun with '
    'the same flags to resume from the last checkpoint).')

FLAG_NAMES = ('workers', 'worker_rpc_timeout_s')


def configure_from_flags() -> None:
  """Sets TFF's execution context from --workers; FlagError on bad input."""
  try:
    runtime.configure(WORKERS.value, rpc_timeout_s=WORKER_RPC_TIMEOUT_S.value)
  except ValueError as e:
    raise flag_groups.FlagError(str(e)) from e
  except runtime.WorkerError as e:
    raise flag_groups.FlagError(f'--workers={",".join(WORKERS.value)}: {e}') from e
