r"""Plots of per-participant adaptation results (Yu et al. 2020, figures 1-6).

  python -m scripts.plot --csv=<run_dir>/adaptation/participants.csv \
      --output_dir=<run_dir>/adaptation --plot_title='FEMNIST, FedAvg'

From the CSV of `scripts.adapt` writes:
* `federated_vs_local.png` (figures 1-2): one dot per participant, its local
  from-scratch accuracy (x) against the federated model's accuracy (y); dots
  under the diagonal are participants whose local model beats the federated one.
* `adapted_minus_local.png` (figures 3-5): per participant, best adapted
  accuracy minus local accuracy, against local accuracy; colour = the best
  strategy; dots under zero are participants adaptation does not rescue.
* `adapted_minus_federated.png` (figure 6, bottom): the same minus the
  federated accuracy (what adaptation adds to the federated model).
"""

import os

from absl import app
from absl import flags

from scripts import flag_groups
import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

from tff_partial.adaptation import summary as summary_lib

_CSV = flags.DEFINE_string('csv', None, 'participants.csv written by scripts.adapt.')
_TITLE = flags.DEFINE_string('plot_title', '', 'Title prefix, e.g. "FEMNIST, DP-FedAvg".')

_COLORS = {'finetune': 'tab:blue', 'freeze_base': 'tab:orange',
           'ewc': 'tab:green', 'distill': 'tab:red'}


def _title(text: str) -> str:
  return f'{_TITLE.value}: {text}' if _TITLE.value else text


def plot_federated_vs_local(rows, path: str) -> None:
  local = [100 * r['local'] for r in rows]
  fed = [100 * r['federated'] for r in rows]
  below = sum(1 for f, l in zip(fed, local) if f < l)
  fig, ax = plt.subplots(figsize=(5.5, 5))
  ax.scatter(local, fed, s=18, alpha=0.75, color='tab:blue', edgecolors='none')
  ax.plot([0, 100], [0, 100], color='gray', linestyle='--', linewidth=1,
          label='federated = local')
  ax.set_xlim(0, 100)
  ax.set_ylim(0, 100)
  ax.set_xlabel('local (trained from scratch) accuracy, %')
  ax.set_ylabel('federated model accuracy, %')
  ax.set_title(_title(f'federated < local for {below}/{len(rows)}'), fontsize=10)
  ax.legend(loc='lower right', fontsize=8)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_improvement(rows, strategy_names, baseline: str, path: str) -> None:
  fig, ax = plt.subplots(figsize=(7, 4.5))
  below = 0
  for name in strategy_names:
    xs, ys = [], []
    for r in rows:
      best, acc, _ = summary_lib.best_strategy(r, strategy_names)
      if best == name:
        xs.append(100 * r['local'])
        ys.append(100 * (acc - r[baseline]))
    below += sum(1 for y in ys if y < 0)
    if xs:
      ax.scatter(xs, ys, s=18, alpha=0.8, color=_COLORS.get(name),
                 edgecolors='none', label=f'{name} best ({len(xs)})')
  ax.axhline(0, color='gray', linestyle='--', linewidth=1)
  ax.set_xlabel('local (trained from scratch) accuracy, %')
  ax.set_ylabel(f'best adapted - {baseline} accuracy, points')
  ax.set_title(_title(f'adapted < {baseline} for {below}/{len(rows)}'), fontsize=10)
  ax.legend(fontsize=8)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def make_plots(csv_path: str, output_dir: str) -> list:
  rows, strategy_names = summary_lib.read_csv(csv_path)
  if not rows:
    raise ValueError(f'--csv={csv_path!r} has no participants')
  if not strategy_names:
    raise ValueError(f'--csv={csv_path!r} has no adaptation strategy columns')
  os.makedirs(output_dir, exist_ok=True)
  paths = [os.path.join(output_dir, n) for n in (
      'federated_vs_local.png', 'adapted_minus_local.png',
      'adapted_minus_federated.png')]
  plot_federated_vs_local(rows, paths[0])
  plot_improvement(rows, strategy_names, 'local', paths[1])
  plot_improvement(rows, strategy_names, 'federated', paths[2])
  return paths


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not _CSV.value or not os.path.exists(_CSV.value):
    raise app.UsageError(f'--csv={_CSV.value!r}: give the participants.csv of scripts.adapt')
  output_dir = flag_groups.OUTPUT_DIR.value or os.path.dirname(os.path.abspath(_CSV.value))
  for path in make_plots(_CSV.value, output_dir):
    print(f'wrote {path}')


if __name__ == '__main__':
  app.run(main)
