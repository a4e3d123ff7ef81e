"""Sweep plots (matplotlib, PNG): test metric against rounds and against bytes per client.

* `<metric>_vs_rounds.png`: one line per config, the mean over seeds, with a
  band of one standard deviation over seeds.
* `<metric>_vs_bytes.png`: the same curves against the cumulative bytes one
  participating client has received and sent (log scale), with each config's
  final mean and its 95% confidence interval: the communication frontier.
"""

import math
import os
from typing import Sequence

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import matplotlib.ticker  # pylint: disable=g-import-not-at-top

from tff_partial.sweep import summary as summary_lib


def _scale(metric: str):
  return (100.0, f'test {metric} (%)') if metric != 'loss' else (1.0, 'test loss')


def _band(ax, x, mean, std, num_seeds, scale, color):
  if num_seeds > 1:
    ax.fill_between(x, scale * (mean - std), scale * (mean + std), color=color, alpha=0.2,
                    linewidth=0)


def _save(fig, ax, path: str) -> str:
  if ax.get_legend_handles_labels()[0]:
    ax.legend(fontsize=7, loc='best')
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def plot_vs_rounds(summaries: Sequence[summary_lib.ConfigSummary], path: str, *,
                   metric: str, title: str = '') -> str:
  scale, label = _scale(metric)
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for i, s in enumerate(summaries):
    if not len(s.rounds):
      continue
    color = f'C{i % 10}'
    ax.plot(s.rounds, scale * s.curve_mean, color=color, linewidth=1.5,
            label=f'{s.config} (n={len(s.seeds)})')
    _band(ax, s.rounds, s.curve_mean, s.curve_std, len(s.seeds), scale, color)
  ax.set_xlabel('round')
  ax.set_ylabel(label)
  ax.set_title(f'{title}: mean over seeds ± 1 std' if title else 'mean over seeds ± 1 std',
               fontsize=10)
  ax.grid(alpha=0.3)
  return _save(fig, ax, path)


def plot_vs_bytes(summaries: Sequence[summary_lib.ConfigSummary], path: str, *,
                  metric: str, title: str = '') -> str:
  scale, label = _scale(metric)
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for i, s in enumerate(summaries):
    trained = s.rounds >= 1
    if not trained.any():
      continue
    color = f'C{i % 10}'
    x = s.cumulative_bytes[trained] / 1e6
    ax.plot(x, scale * s.curve_mean[trained], color=color, linewidth=1.2, alpha=0.8,
            label=s.config)
    _band(ax, x, s.curve_mean[trained], s.curve_std[trained], len(s.seeds), scale, color)
    total = (s.bytes_down + s.bytes_up) / 1e6
    if not math.isnan(s.metric.mean):
      err = None
      if s.metric.n > 1:
        err = [[scale * (s.metric.mean - s.metric.ci_low)],
               [scale * (s.metric.ci_high - s.metric.mean)]]
      ax.errorbar([total], [scale * s.metric.mean], yerr=err, fmt='o', color=color,
                  capsize=3, markersize=4)
  ax.set_xscale('log')
  for axis_formatter in (ax.xaxis.set_major_formatter, ax.xaxis.set_minor_formatter):
    axis_formatter(matplotlib.ticker.FormatStrFormatter('%g'))
  ax.set_xlabel('MB communicated per participating client (down + up, cumulative)')
  ax.set_ylabel(label)
  ax.set_title((f'{title}: ' if title else '') + 'final mean with 95% CI (dots)', fontsize=10)
  ax.grid(alpha=0.3, which='both')
  return _save(fig, ax, path)


def write(out_dir: str, summaries, *, metric: str, title: str = '') -> list:
  os.makedirs(out_dir, exist_ok=True)
  return [
      plot_vs_rounds(summaries, os.path.join(out_dir, f'{metric}_vs_rounds.png'),
                     metric=metric, title=title),
      plot_vs_bytes(summaries, os.path.join(out_dir, f'{metric}_vs_bytes.png'),
                    metric=metric, title=title),
  ]
