"""Starts N local TFF workers on free loopback ports and waits until Ctrl-C.

  python -m scripts.workers --num_workers=2
  # prints: --workers=127.0.0.1:PORT1,127.0.0.1:PORT2
  python -m scripts.train ... --workers=127.0.0.1:PORT1,127.0.0.1:PORT2
"""

import time

from absl import app
from absl import flags

from tff_partial import runtime

_NUM_WORKERS = flags.DEFINE_integer('num_workers', 2, 'Workers to start.')
_LOG_DIR = flags.DEFINE_string('worker_log_dir', None, 'Directory for worker logs.')


def main(argv):
  del argv
  with runtime.local_workers(_NUM_WORKERS.value, log_dir=_LOG_DIR.value) as ws:
    print('--workers=' + ','.join(ws.addresses), flush=True)
    try:
      while all(w.alive() for w in ws):
        time.sleep(1.0)
      dead = [w.address for w in ws if not w.alive()]
      raise SystemExit(f'worker(s) {", ".join(dead)} exited; stopping the rest')
    except KeyboardInterrupt:
      pass


if __name__ == '__main__':
  app.run(main)
