"""Paired per-round ratios of the client-loop benchmark runs (same round = same clients).

  python3 ratios.py DIR

DIR holds `<task>_dnn<0|1>.json` (as committed here) or `<task>_dnn<0|1>/benchmark.json`
(as run.sh writes them); prints the Markdown table of ratios.md.
"""
import json
import os
import statistics
import sys


def _runs(root):
  for name in sorted(os.listdir(root)):
    for path, stem in ((os.path.join(root, name, 'benchmark.json'), name),
                       (os.path.join(root, name), name[:-len('.json')])):
      if path.endswith('.json') and os.path.isfile(path) and '_dnn' in stem:
        yield stem, path


def _cell(row):
  return f"{row['median_round_seconds']:.2f} ({row['median_round_cpu_seconds']:.2f})"


def _ratios(a, b, key):
  r = [x / y for x, y in zip(a[key], b[key])]
  return f'{statistics.median(r):.2f} [{min(r):.2f}, {max(r):.2f}]'


def main(root):
  print('| task | oneDNN | TFF default s (CPU s) | package reduce s (CPU s) | package iterator s '
        '(CPU s) | iterator / reduce wall: median [min, max] | CPU: median [min, max] | '
        'iterator / TFF default wall (CPU) |')
  print('|---|---|---|---|---|---|---|---|')
  for stem, path in _runs(root):
    with open(path) as f:
      rows = {r['name']: r for r in json.load(f)['rows']}
    t, r, i = rows['tff_fedavg'], rows['fedavg_reduce'], rows['fedavg_iterator']
    task, dnn = stem.rsplit('_dnn', 1)
    wall = i['median_round_seconds'] / t['median_round_seconds']
    cpu = i['median_round_cpu_seconds'] / t['median_round_cpu_seconds']
    print(f"| {task} | {'on' if dnn == '1' else 'off'} | {_cell(t)} | {_cell(r)} | {_cell(i)} | "
          f"{_ratios(i, r, 'round_seconds_all')} | {_ratios(i, r, 'round_cpu_seconds_all')} | "
          f'{wall:.2f} ({cpu:.2f}) |')


if __name__ == '__main__':
  main(sys.argv[1])
