"""--workers: run rounds on several TFF C++ workers (tff_partial.runtime).

`scripts.train` (and any binary) imports this module for its flags and calls
`configure_from_flags()` once before building processes:

  --workers=127.0.0.1:10001,127.0.0.1:10002   clients spread over these workers
  --workers=                                  (default) the local C++ runtime
  --workers=10.0.0.5:10001 --allow_remote_workers   workers on other hosts

Start workers with `python -m scripts.workers --num_workers=2` (prints the
--workers value) or `tff_partial.runtime.local_workers(n)` in Python; on other
hosts, see docs/distributed.md.
"""

from typing import Optional

from absl import flags

from scripts import flag_groups
from tff_partial import runtime
from tff_partial.runtime import local

WORKERS = flags.DEFINE_list(
    'workers', [],
    'Comma-separated host:port of running TFF worker_binary processes; each '
    'round\'s clients are spread over them. Empty: the local C++ runtime. '
    'Hosts must be loopback unless --allow_remote_workers is given.')
ALLOW_REMOTE_WORKERS = flags.DEFINE_bool(
    'allow_remote_workers', False,
    'Accept --workers (and scripts.workers --bind) addresses that are not '
    f'loopback. {runtime.REMOTE_RISK}. Use it only over an SSH tunnel '
    '(then the addresses stay loopback and this flag is not needed) or on a '
    'private network that only you can reach (docs/distributed.md).')
WORKER_RPC_TIMEOUT_S = flags.DEFINE_float(
    'worker_rpc_timeout_s', 600.0,
    'Deadline in seconds of every call to a worker; a worker that dies or '
    'does not answer in time fails the round with a clear error (rerun with '
    'the same flags to resume from the last checkpoint).')

WORKER_MAX_CLIENTS_PER_SUBROUND = flags.DEFINE_integer(
    'worker_max_clients_per_subround', 50,
    'With --workers: cut each round into sub-rounds of at most this many '
    'clients, run one after another on each worker and merged (TFF\'s '
    'mergeable aggregation). A worker holds every client of its sub-round at '
    'once (about 4.5x the model\'s bytes per client: ~31 MiB for '
    'emnist_cnn_gn), so this bounds worker memory whatever the cohort; each '
    'extra sub-round costs ~0.1-0.2 CPU s. 0: one sub-round per worker '
    '(TFF\'s default, memory grows with the cohort).', lower_bound=0)

LOCAL_CLIENT_PARALLELISM = flags.DEFINE_string(
    'local_client_parallelism', local.AUTO,
    'Without --workers: how the local TFF worker shares this machine\'s cores '
    'among a round\'s clients. auto: one client per core, one TensorFlow '
    'thread each (2 cores, 10 clients: 2 at once); the numbers are then the '
    'same whatever the core count (multi-threaded kernels round differently '
    'with the number of threads). tff: TFF\'s default worker (every client at '
    'once, one shared pool of one thread per core; faster when a round\'s '
    'clients do not fill the cores, e.g. 3 on 2, but its rounding depends on '
    'the core count); N: N clients at once, cores // N threads each '
    '(docs/benchmarks.md measured them).')

LOCAL_WORKER_RESTART_MB = flags.DEFINE_integer(
    'local_worker_restart_mb', local.DEFAULT_WORKER_RESTART_MB,
    'Without --workers: restart the local TFF worker before a round once it '
    'has grown by this many MB since the loop first measured it. It keeps '
    'memory it never gives back (5-10 MB a round measured on '
    'shakespeare_word: 2.7 GB after 400 rounds); a restart cost 12 s there '
    'and changes no result. 0: before every round; negative: never.')

FLAG_NAMES = ('workers', 'allow_remote_workers', 'worker_rpc_timeout_s',
              'worker_max_clients_per_subround', 'local_client_parallelism',
              'local_worker_restart_mb')


def local_parallelism() -> tuple[int, Optional[int]]:
  """(clients at once, intra-op threads) of the local worker; FlagError if bad."""
  try:
    return local.client_parallelism(LOCAL_CLIENT_PARALLELISM.value)
  except ValueError as e:
    raise flag_groups.FlagError(str(e)) from e


def describe_local_parallelism() -> str:
  """What --local_client_parallelism resolved to, in words."""
  at_once, threads = local_parallelism()
  if at_once < 0:
    return f'{LOCAL_CLIENT_PARALLELISM.value}: TFF default (all clients at once, default threads)'
  return (f'{LOCAL_CLIENT_PARALLELISM.value}: {at_once} clients at once, '
          f'{threads} intra-op thread(s) each ({local.available_cores()} cores)')


def configure_from_flags() -> None:
  """Sets TFF's execution context from --workers; FlagError on bad input."""
  configure(WORKERS.value)


def configure(workers) -> None:
  """Sets TFF's execution context on `workers` (host:port list) with this module's flags.

  Raises:
    flag_groups.FlagError: a bad or unreachable address (one line).
  """
  try:
    runtime.configure(workers, rpc_timeout_s=WORKER_RPC_TIMEOUT_S.value,
                      allow_remote=ALLOW_REMOTE_WORKERS.value,
                      max_clients_per_subround=WORKER_MAX_CLIENTS_PER_SUBROUND.value or None,
                      local_parallelism=local_parallelism())
  except ValueError as e:
    raise flag_groups.FlagError(str(e)) from e
  except runtime.WorkerError as e:
    raise flag_groups.FlagError(f'--workers={",".join(workers)}: {e}') from e
