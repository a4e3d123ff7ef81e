"""Peak memory and CPU time of the coordinator and of local TFF workers over a block.

    with ResourceUsage(workers) as usage:
      ... rounds ...
    usage.result()  # {'worker_peak_rss_bytes': [...], 'coordinator_peak_rss_bytes': N,
                    #  'worker_cpu_seconds': [...], 'coordinator_cpu_seconds': S}

The peak is the kernel's high-water mark of resident memory (VmHWM), reset at
the start of the block (Linux: writing 5 to /proc/PID/clear_refs), so each
block (e.g. each cohort of a scaling sweep) gets its own peak. CPU seconds are
user + system time spent in the block, by this process alone (the
coordinator: building and serializing client data, merging sub-rounds'
results, server-side Python) and by each worker.
"""

import os
from typing import Sequence

import psutil

from tff_partial.runtime import workers as workers_lib

_GIB = 2**30


class ResourceUsage:
  """Context manager: peak RSS and CPU seconds of this process and of `workers`."""

  def __init__(self, workers: Sequence[workers_lib.LocalWorker] = ()):
    self._workers = list(workers)
    self._result = None

  def _cpu(self) -> list[float]:
    """CPU seconds so far: this process, then each worker."""
    processes = [psutil.Process()] + [psutil.Process(w.process.pid)
                                      for w in self._workers]
    return [sum(p.cpu_times()[:2]) for p in processes]

  def __enter__(self):
    workers_lib.reset_peak_rss(os.getpid())
    for worker in self._workers:
      worker.reset_peak_rss()
    self._cpu_start = self._cpu()
    return self

  def __exit__(self, *exc):
    cpu = [b - a for a, b in zip(self._cpu_start, self._cpu())]
    self._result = {
        'coordinator_peak_rss_bytes': workers_lib.peak_rss_bytes(os.getpid()),
        'worker_peak_rss_bytes': [w.peak_rss_bytes() for w in self._workers],
        'coordinator_cpu_seconds': cpu[0],
        'worker_cpu_seconds': cpu[1:],
    }
    return False

  def result(self) -> dict:
    return dict(self._result)

  @staticmethod
  def markdown_rows(report: dict) -> list[str]:
    """Rows (GiB per cohort) for a scaling table with one column per cohort."""
    pad = ' | | | |'
    rows = []
    coordinator = report.get('coordinator_peak_rss_bytes')
    if coordinator:
      rows.append('| coordinator peak RSS GiB | '
                  + ' | '.join(f'{b / _GIB:.2f}' for b in coordinator) + pad)
    per_cohort = report.get('worker_peak_rss_bytes') or []
    for i in range(len(per_cohort[0]) if per_cohort and per_cohort[0] else 0):
      rows.append(f'| worker {i + 1} peak RSS GiB | '
                  + ' | '.join(f'{c[i] / _GIB:.2f}' for c in per_cohort) + pad)
    if report.get('coordinator_cpu_seconds'):
      rows.append('| coordinator CPU s (all rounds) | '
                  + ' | '.join(f'{c:.1f}' for c in report['coordinator_cpu_seconds'])
                  + pad)
      rows.append('| workers CPU s (all rounds) | '
                  + ' | '.join(f'{sum(c):.1f}' for c in report['worker_cpu_seconds'])
                  + pad)
    return rows
