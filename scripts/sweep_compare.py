r"""Compares arms and their gaps to a reference across published sweep summaries.

  python -m scripts.sweep_compare \
      --sweeps=10_roles=docs/results/pvt_shakespeare_char_tuned,20_roles=docs/results/pvt_shakespeare_char_tuned_2x_clients \
      --reference=fedavg --configs=pvt_pcpr90 --window=151,200

Each item of --sweeps is label=<summary dir> (what `scripts.sweep
--summary_dir` wrote: runs.csv and curves/); the first is the base. It prints
a Markdown table: each arm's final test accuracy (mean ± sample std over
seeds, in points) per sweep, the same averaged over the rounds of --window,
each config's gap to --reference with its standard error, and the change of
every arm and gap from the base to each other sweep. Definitions:
`tff_partial.sweep.compare`.

--metric=loss compares the test loss (nats) instead of the accuracy (points).
--suffixes compares groups of configs of one sweep that differ in one factor
carried in their names, e.g. the noise levels of one DP sweep:

  python -m scripts.sweep_compare --metric=loss \
      --sweeps=z0=docs/results/dp_fedpt_shakespeare_word,z1=docs/results/dp_fedpt_shakespeare_word \
      --suffixes=z0=_z0,z1=_z1 --reference=fedavg --configs=fedpt_lstm1

--running compares a sweep that has not finished, which has no summary yet:
each --sweeps item is then a sweep (or bank) directory, whose runs'
metrics.csv are read as they stand. Only --window is compared, and only once
every run has logged the window's last round:

  python -m scripts.sweep_compare --running --window=3501,3750 \
      --sweeps=r6000=experiments/banked/fedpt_table1_cifar10_6000 --reference=fedavg \
      --configs=fedpt+frozen_target_trainable_fraction=0.2625

--paired adds, per sweep and view, each config's gap to --reference seed by
seed, and the mean and s.e. of those paired gaps: arms of one sweep with the
same seed and clients per round meet the same clients in the same rounds.
"""

import sys

from absl import app
from absl import flags

from tff_partial.sweep import compare
from tff_partial.training import atomic

_SWEEPS = flags.DEFINE_list(
    'sweeps', None, 'label=summary_dir,...: the summaries to compare, the base first.')
_REFERENCE = flags.DEFINE_string('reference', 'fedavg', 'The config the gaps are taken to.')
_CONFIGS = flags.DEFINE_list('configs', None, 'The configs compared with --reference.')
_WINDOW = flags.DEFINE_list(
    'window', [], 'first,last: also average each run\'s evaluations over these rounds '
    '(both included), e.g. 151,200.')
_METRIC = flags.DEFINE_enum(
    'metric', 'accuracy', sorted(compare.METRICS),
    'The final test metric compared: accuracy (points) or loss (nats).')
_SUFFIXES = flags.DEFINE_list(
    'suffixes', [], 'label=suffix,...: the configs of sweep <label> are named '
    '<config><suffix> (e.g. fedavg_z1 for --reference=fedavg and z1=_z1).')
_RUNNING = flags.DEFINE_bool(
    'running', False, 'The --sweeps directories are sweep (or bank) directories whose runs '
    'may be unfinished: compare --window only, from each run\'s metrics.csv.')
_PAIRED = flags.DEFINE_bool(
    'paired', False, 'Also list each config\'s gap to --reference seed by seed, with the '
    'mean and s.e. of those paired gaps (arms of one sweep at one seed meet the same clients).')
_OUTPUT = flags.DEFINE_string('output', None, 'Also write the table to this Markdown file.')


def _fail(message: str) -> None:
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def _sweeps() -> list:
  sweeps = []
  for item in _SWEEPS.value or []:
    label, sep, directory = item.partition('=')
    if not sep or not label or not directory:
      _fail(f'--sweeps item {item!r} must be label=summary_dir')
    sweeps.append((label, directory))
  if len(sweeps) < 1 or len({label for label, _ in sweeps}) < len(sweeps):
    _fail('--sweeps needs one or more label=summary_dir items with distinct labels')
  return sweeps


def _window():
  if not _WINDOW.value:
    return None
  try:
    first, last = (int(v) for v in _WINDOW.value)
  except ValueError:
    _fail(f'--window={",".join(_WINDOW.value)} must be two rounds, first,last')
  if not 0 <= first <= last:
    _fail(f'--window={first},{last} must have 0 <= first <= last')
  return first, last


def _suffixes(labels) -> dict:
  suffixes = {}
  for item in _SUFFIXES.value:
    label, sep, suffix = item.partition('=')
    if not sep or not label or not suffix:
      _fail(f'--suffixes item {item!r} must be label=suffix')
    if label not in labels:
      _fail(f'--suffixes names {label!r}, which is no --sweeps label (' + ', '.join(labels) + ')')
    suffixes[label] = suffix
  return suffixes


def main(argv):
  if len(argv) > 1:
    _fail(f'unexpected arguments: {" ".join(argv[1:])}')
  sweeps, window = _sweeps(), _window()
  if _RUNNING.value and window is None:
    _fail('--running compares rounds of unfinished runs: give --window=first,last')
  suffixes = _suffixes([label for label, _ in sweeps])
  if not _CONFIGS.value:
    _fail('--configs is required: the configs to compare with --reference')
  try:
    lines = compare.table(sweeps, _REFERENCE.value, _CONFIGS.value, window,
                          metric=_METRIC.value, suffixes=suffixes, running=_RUNNING.value,
                          paired_seeds=_PAIRED.value)
  except compare.CompareError as e:
    _fail(str(e))
  text = '\n'.join(lines) + '\n'
  print(text, end='')
  if _OUTPUT.value:
    with atomic.atomic_write(_OUTPUT.value) as f:
      f.write(text)


if __name__ == '__main__':
  app.run(main)
