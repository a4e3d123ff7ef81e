"""Local adaptation over training seeds: one row per config of a sweep.

Yu, Bagdasaryan, Shmatikov, *Salvaging Federated Learning by Local Adaptation*
(2020), ask for each participant whether the federated model beats the model it
could train alone, and whether adapting the federated model helps, leaves
unchanged or hurts it. `scripts.adapt` answers that for the participants of one
trained model (`summary.summarize`, its `summary.json`). A claim about an
aggregator needs several trained models: here each training seed's summary is one
observation, and every measure below is reported as mean and sample standard
deviation over the seeds of a config.

Measures (per seed, over its participants):
* `federated`, `local`, `best_adapted`: mean accuracy (or class-ratio accuracy)
  of the federated model, of the from-scratch local models and of the best of
  the adaptation strategies per participant;
* `federated_below_local`, `best_adapted_below_local`: shares of participants
  whose local model beats the federated / the best adapted model;
* `helped`, `unchanged`, `hurt`: shares of participants whose best adapted
  model is above, equal to, below the federated model.
"""

import collections
from typing import Callable, Mapping, Sequence

from tff_partial.sweep import summary as sweep_summary

_BEST = 'best_adapted'

# name -> how to read it from a scripts.adapt summary (accuracies and shares
# are fractions).
MEASURES: 'collections.OrderedDict[str, Callable[[Mapping], float]]' = collections.OrderedDict([
    ('federated', lambda s: s['accuracy']['federated']['mean']),
    ('local', lambda s: s['accuracy']['local']['mean']),
    ('best_adapted', lambda s: s['accuracy'][_BEST]['mean']),
    ('federated_below_local', lambda s: s['federated_below_local']['share']),
    ('best_adapted_below_local', lambda s: s['adapted_below_local'][_BEST]['share']),
    ('helped', lambda s: s['adapted_vs_federated'][_BEST]['helped']['share']),
    ('unchanged', lambda s: s['adapted_vs_federated'][_BEST]['unchanged']['share']),
    ('hurt', lambda s: s['adapted_vs_federated'][_BEST]['hurt']['share']),
])


def summarize_config(summaries: Sequence[Mapping]) -> dict:
  """{'seeds', 'participants', measure: sweep.summary.Stats} over a config's seeds."""
  if not summaries:
    raise ValueError('no adaptation summaries to summarize')
  out = {'seeds': len(summaries),
         'participants': sorted({int(s['num_participants']) for s in summaries})}
  for name, read in MEASURES.items():
    out[name] = sweep_summary.describe([read(s) for s in summaries])
  return out


def rows(by_config: Mapping[str, Sequence[Mapping]]) -> list:
  """CSV rows: config, seeds, participants, <measure>_mean / _std (fractions)."""
  out = []
  for config, summaries in by_config.items():
    result = summarize_config(summaries)
    row = {'config': config, 'seeds': result['seeds'],
           'participants': '/'.join(map(str, result['participants']))}
    for name in MEASURES:
      row[f'{name}_mean'] = result[name].mean
      row[f'{name}_std'] = result[name].std
    out.append(row)
  return out


def _cell(stats: sweep_summary.Stats) -> str:
  if stats.n == 1:
    return f'{100 * stats.mean:.1f}'
  return f'{100 * stats.mean:.1f} ± {100 * stats.std:.1f}'


def markdown(by_config: Mapping[str, Sequence[Mapping]]) -> str:
  """A Markdown table, in %: mean ± sample std over seeds."""
  header = ('| config | seeds | participants per seed | federated | local | best adapted '
            '| federated < local | best adapted < local | best adapted vs federated: '
            'helped / unchanged / hurt |')
  lines = [header, '|' + '---|' * 9]
  for config, summaries in by_config.items():
    r = summarize_config(summaries)
    lines.append(
        f'| {config} | {r["seeds"]} | {"/".join(map(str, r["participants"]))} '
        f'| {_cell(r["federated"])} | {_cell(r["local"])} | {_cell(r["best_adapted"])} '
        f'| {_cell(r["federated_below_local"])} | {_cell(r["best_adapted_below_local"])} '
        f'| {_cell(r["helped"])} / {_cell(r["unchanged"])} / {_cell(r["hurt"])} |')
  return '\n'.join(lines)
