"""Starts TFF workers and waits until Ctrl-C; prints the --workers value to use.

  python -m scripts.workers --num_workers=2
  # prints: --workers=127.0.0.1:PORT1,127.0.0.1:PORT2
  python -m scripts.train ... --workers=127.0.0.1:PORT1,127.0.0.1:PORT2

Workers listen on 127.0.0.1 only. To serve another host (docs/distributed.md):

  python -m scripts.workers --bind=0.0.0.0:10001 --allow_remote_workers
  # prints: --workers=THIS_HOST:10001 --allow_remote_workers

A worker runs any TensorFlow graph it is sent (file I/O included) over
plaintext, unauthenticated gRPC: prefer an SSH tunnel to a loopback worker, or
a private network only you can reach.
"""

import ipaddress
import socket
import sys
import time

from absl import app
from absl import flags
import psutil

from scripts import runtime_flags
from tff_partial import runtime

_NUM_WORKERS = flags.DEFINE_integer(
    'num_workers', None, 'Workers to start on 127.0.0.1 and free ports '
    '(default 2 without --bind).')
_BIND = flags.DEFINE_list(
    'bind', [],
    'host:port to listen on, one worker each (e.g. 127.0.0.1:10001, or '
    '0.0.0.0:10001 for every interface). A host that is not loopback needs '
    '--allow_remote_workers.')
_ADVERTISE_HOST = flags.DEFINE_string(
    'advertise_host', None,
    'Host name or address that other hosts use to reach this one, for the '
    'printed --workers value when a worker listens on every interface '
    '(default: this host\'s name).')
_MAX_CALLS = flags.DEFINE_integer(
    'max_concurrent_computation_calls', -1,
    'The workers\' own flag: concurrent calls of one computation (-1: no limit).')
_LOG_DIR = flags.DEFINE_string('worker_log_dir', None, 'Directory for worker logs.')


def advertised_address(worker: runtime.LocalWorker) -> str:
  """The host:port other processes should connect to for `worker`."""
  if ipaddress.ip_address(worker.bind_host).is_unspecified:
    host = _ADVERTISE_HOST.value or socket.gethostname()
    return f'{host}:{worker.port}'
  return worker.address


def _non_loopback_addresses() -> list[str]:
  return sorted({a.address.split('%')[0]
                 for addrs in psutil.net_if_addrs().values() for a in addrs
                 if a.family in (socket.AF_INET, socket.AF_INET6)
                 and not runtime.is_loopback(a.address.split('%')[0])})


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if _BIND.value and _NUM_WORKERS.value is not None:
    sys.exit('error: give --num_workers or --bind, not both')
  allow_remote = runtime_flags.ALLOW_REMOTE_WORKERS.value
  try:
    workers = runtime.local_workers(
        num_workers=0 if _BIND.value else (_NUM_WORKERS.value or 2),
        binds=_BIND.value, allow_remote=allow_remote, log_dir=_LOG_DIR.value,
        max_concurrent_computation_calls=_MAX_CALLS.value)
    with workers as ws:
      addresses = [advertised_address(w) for w in ws]
      remote = not all(runtime.is_loopback(w.bind_host) for w in ws)
      if remote:
        print(f'WARNING: workers reachable from other hosts: {runtime.REMOTE_RISK}. '
              f'This host\'s addresses: {", ".join(_non_loopback_addresses())}',
              file=sys.stderr, flush=True)
      print('--workers=' + ','.join(addresses)
            + (' --allow_remote_workers' if remote else ''), flush=True)
      try:
        while all(w.alive() for w in ws):
          time.sleep(1.0)
        dead = [w.address for w in ws if not w.alive()]
        raise SystemExit(f'worker(s) {", ".join(dead)} exited; stopping the rest')
      except KeyboardInterrupt:
        pass
  except (ValueError, runtime.WorkerError) as e:
    sys.exit(f'error: {e}')


if __name__ == '__main__':
  app.run(main)
