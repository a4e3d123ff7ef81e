"""Per-round ratios of a `scripts.benchmark` JSON file against one configuration.

Prints, per configuration: median wall and CPU seconds of a round, CPU seconds
per wall second (how many of the cores were busy), the median of the per-round
wall and CPU ratios to the base configuration (same round, same clients), the
range of the wall ratios, and every timed round's wall seconds.

    python docs/benchmark_results/issue17_per_round_ratios.py FILE.json [BASE=fedavg]
"""
import json
import sys

import numpy as np

d = json.load(open(sys.argv[1]))
rows = {r['name']: r for r in d['rows']}
base = rows[sys.argv[2] if len(sys.argv) > 2 else 'fedavg']
bw, bc = np.array(base['round_seconds_all']), np.array(base['round_cpu_seconds_all'])
for n, r in rows.items():
  w, c = np.array(r['round_seconds_all']), np.array(r['round_cpu_seconds_all'])
  k = min(len(w), len(bw))
  rw, rc = w[:k] / bw[:k], c[:k] / bc[:k]
  print(f'{n:18s} wall {np.median(w):.2f} cpu {np.median(c):.2f} cores {np.median(c / w):.2f} | '
        f'per-round wall ratio median {np.median(rw):.3f} [{rw.min():.2f}, {rw.max():.2f}] '
        f'cpu {np.median(rc):.3f} | rounds {np.round(w, 2).tolist()}')
