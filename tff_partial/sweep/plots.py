"""Sweep plots (matplotlib, PNG): test metric against rounds and against bytes per client.

* `<metric>_vs_rounds.png`: one line per config, the mean over seeds, with a
  band of one standard deviation over seeds.
* `<metric>_vs_bytes.png`: the same curves against the cumulative bytes one
  participating client has received and sent (log scale), with each config's
  final mean and its 95% confidence interval: the communication frontier.

When the summary metric is the loss, the same two plots of the accuracy
(`accuracy_vs_rounds.png`, `accuracy_vs_bytes.png`) are written too.
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
  """(factor, axis label): the summary tables' scale (`summary.metric_scale`)."""
  factor, unit = summary_lib.metric_scale(metric)
  return factor, f'test {metric}{unit}'


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


def _curve(s: summary_lib.ConfigSummary, second: bool) -> tuple:
  """(mean curve, std curve, final Stats) of the summary metric, or of the second one."""
  if second:
    return s.second_curve_mean, s.second_curve_std, s.second
  return s.curve_mean, s.curve_std, s.metric


def plot_vs_rounds(summaries: Sequence[summary_lib.ConfigSummary], path: str, *,
                   metric: str, title: str = '', second: bool = False) -> str:
  """`metric` is the name of what is plotted: the summary's, or with `second` the other one."""
  scale, label = _scale(metric)
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for i, s in enumerate(summaries):
    if not len(s.rounds):
      continue
    color = f'C{i % 10}'
    mean, std, _ = _curve(s, second)
    ax.plot(s.rounds, scale * mean, color=color, linewidth=1.5,
            label=f'{s.config} (n={len(s.seeds)})')
    _band(ax, s.rounds, mean, std, len(s.seeds), scale, color)
  ax.set_xlabel('round')
  ax.set_ylabel(label)
  ax.set_title(f'{title}: mean over seeds ± 1 std' if title else 'mean over seeds ± 1 std',
               fontsize=10)
  ax.grid(alpha=0.3)
  return _save(fig, ax, path)


# Largest span (hi / lo) of a log axis whose minor ticks 2 and 5 get labels too:
# over two decades they would overlap (12 labels a decade at 7 inches).
# Not matplotlib's LogFormatter(minor_thresholds=...), which thins minor labels
# alike but writes values above 10,000 in e-notation ('1e+05'; bytes axes pass 20,000 MB).
_MINOR_LABEL_SPAN = 100.0


def _plain_log_ticks(axis) -> None:
  """Plain-number labels ('20', not '2x10^1') on a log axis: every power of ten,
  and 2 and 5 of each decade only when the axis spans at most two decades."""
  plain = matplotlib.ticker.FormatStrFormatter('%g')
  axis.set_major_formatter(plain)
  lo, hi = axis.get_view_interval()
  if lo > 0 and hi / lo <= _MINOR_LABEL_SPAN:
    axis.set_minor_locator(matplotlib.ticker.LogLocator(subs=(2.0, 5.0)))
    axis.set_minor_formatter(plain)
  else:
    axis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def plot_vs_bytes(summaries: Sequence[summary_lib.ConfigSummary], path: str, *,
                  metric: str, title: str = '', second: bool = False) -> str:
  """`metric` is the name of what is plotted: the summary's, or with `second` the other one."""
  scale, label = _scale(metric)
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for i, s in enumerate(summaries):
    trained = s.rounds >= 1
    if not trained.any():
      continue
    color = f'C{i % 10}'
    mean, std, final = _curve(s, second)
    x = s.cumulative_bytes[trained] / 1e6
    ax.plot(x, scale * mean[trained], color=color, linewidth=1.2, alpha=0.8, label=s.config)
    _band(ax, x, mean[trained], std[trained], len(s.seeds), scale, color)
    total = (s.bytes_down + s.bytes_up) / 1e6
    if not math.isnan(final.mean):
      err = None
      if final.n > 1:
        err = [[scale * (final.mean - final.ci_low)], [scale * (final.ci_high - final.mean)]]
      ax.errorbar([total], [scale * final.mean], yerr=err, fmt='o', color=color,
                  capsize=3, markersize=4)
  ax.set_xscale('log')
  _plain_log_ticks(ax.xaxis)
  ax.set_xlabel('MB communicated per participating client (down + up, cumulative)')
  ax.set_ylabel(label)
  ax.set_title((f'{title}: ' if title else '') + 'final mean with 95% CI (dots)', fontsize=10)
  ax.grid(alpha=0.3, which='both')
  return _save(fig, ax, path)


def write(out_dir: str, summaries, *, metric: str, title: str = '') -> list:
  """The plots of `metric` and, when it is the loss, of the accuracy too; their paths."""
  os.makedirs(out_dir, exist_ok=True)
  plotted = [(metric, False)]
  if metric == 'loss':
    plotted.append((summary_lib.second_metric(metric), True))
  paths = []
  for name, second in plotted:
    paths += [
        plot_vs_rounds(summaries, os.path.join(out_dir, f'{name}_vs_rounds.png'),
                       metric=name, title=title, second=second),
        plot_vs_bytes(summaries, os.path.join(out_dir, f'{name}_vs_bytes.png'),
                      metric=name, title=title, second=second),
    ]
  return paths
