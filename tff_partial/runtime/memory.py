"""Peak resident memory of the coordinator and of local TFF workers over a block.

    with PeakMemory(workers) as peaks:
      ... rounds ...
    peaks.result()  # {'worker_peak_rss_bytes': [...], 'coordinator_peak_rss_bytes': N}

The peak is the kernel's high-water mark of resident memory (VmHWM), reset at
the start of the block (Linux: writing 5 to /proc/PID/clear_refs), so each
block (e.g. each cohort of a scaling sweep) gets its own peak.
"""

import os
from typing import Sequence

from tff_partial.runtime import workers as workers_lib

_GIB = 2**30


class PeakMemory:
  """Context manager measuring peak RSS of this process and of `workers`."""

  def __init__(self, workers: Sequence[workers_lib.LocalWorker] = ()):
    self._workers = list(workers)
    self._result = None

  def __enter__(self):
    workers_lib.reset_peak_rss(os.getpid())
    for worker in self._workers:
      worker.reset_peak_rss()
    return self

  def __exit__(self, *exc):
    self._result = {
        'coordinator_peak_rss_bytes': workers_lib.peak_rss_bytes(os.getpid()),
        'worker_peak_rss_bytes': [w.peak_rss_bytes() for w in self._workers],
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
    return rows
