"""Benchmark configurations: (name, algorithm, flag overrides) and presets.

`tff_fedavg` is TFF's own FedAvg and data path; every other algorithm is
built by the benchmark binary through `scripts/methods/<algorithm>.py` with
the overrides set as flags.
"""

import collections
import dataclasses
from typing import Optional, Sequence

TFF_FEDAVG = 'tff_fedavg'


@dataclasses.dataclass
class Config:
  name: str
  algorithm: str
  overrides: dict


PRESETS = collections.OrderedDict(
    (c.name, c) for c in [
        # TFF's FedAvg as a user calls it (its default loop, dataset.reduce) ...
        Config('tff_fedavg', TFF_FEDAVG, {}),
        # ... and with TFF's iterator loop.
        Config('tff_fedavg_iterator', TFF_FEDAVG, {'client_loop': 'iterator'}),
        # This package's FedAvg (--client_loop default: auto) ...
        Config('fedavg', 'fedavg', {}),
        # ... with each of TFF's loops.
        Config('fedavg_reduce', 'fedavg', {'client_loop': 'reduce'}),
        Config('fedavg_iterator', 'fedavg', {'client_loop': 'iterator'}),
        # FedPT: freeze the big dense layer (FedPT appendix, EMNIST CNN) ...
        Config('fedpt_dense1', 'fedpt', {'frozen_layers': 'dense1'}),
        # ... or every convolution (normalization layers always train, as in
        # FedPT) ...
        Config('fedpt_convs', 'fedpt', {'frozen_regex': '.*conv.*'}),
        # ... or the largest layers until 10% stays trainable ...
        Config('fedpt_most', 'fedpt', {'frozen_target_trainable_fraction': 0.1}),
        # ... or, until 10% stays trainable, layers in the model's order (a
        # frozen prefix needs no backward pass; the paper's CIFAR-10 ladder
        # freezes largest first, tff_partial/frozen/selection.py).
        Config('fedpt_prefix', 'fedpt', {'frozen_target_trainable_fraction': 0.1,
                                         'frozen_order': 'input_first'}),
        Config('pvt_fixed_0.5', 'pvt', {'pvt_scheme': 'fixed', 'pvt_freeze_fraction': 0.5}),
        Config('pvt_per_client_0.5', 'pvt',
               {'pvt_scheme': 'per_client_per_round', 'pvt_freeze_fraction': 0.5}),
        Config('select_conv2_random', 'select',
               {'select_layer': 'conv2', 'select_keys': 16, 'select_policy': 'random'}),
    ])

# Presets per task (the ones that make sense for its model).
TASK_PRESETS = {
    'emnist_cnn_gn': ('tff_fedavg', 'tff_fedavg_iterator', 'fedavg', 'fedpt_dense1',
                      'fedpt_convs', 'pvt_fixed_0.5', 'pvt_per_client_0.5',
                      'select_conv2_random'),
    'emnist_cnn': ('tff_fedavg', 'tff_fedavg_iterator', 'fedavg', 'fedpt_dense1',
                   'pvt_fixed_0.5', 'select_conv2_random'),
    'cifar10_resnet18': ('tff_fedavg', 'tff_fedavg_iterator', 'fedavg', 'fedpt_most',
                         'fedpt_prefix', 'fedpt_convs', 'pvt_fixed_0.5',
                         'pvt_per_client_0.5'),
}
DEFAULT_PRESETS = ('tff_fedavg', 'tff_fedavg_iterator', 'fedavg', 'pvt_fixed_0.5')


def parse_custom(spec: str, algorithms: Sequence[str]) -> Config:
  """NAME:ALGORITHM[:FLAG=VALUE;FLAG=VALUE] -> Config (ValueError if malformed)."""
  parts = spec.split(':', 2)
  if len(parts) < 2 or not parts[0] or not parts[1]:
    raise ValueError(
        f'--benchmark_config={spec!r}: expected NAME:ALGORITHM[:FLAG=VALUE;...]')
  name, algorithm = parts[0], parts[1]
  if algorithm not in algorithms:
    raise ValueError(f'--benchmark_config={spec!r}: algorithm {algorithm!r}; valid '
                     'values: ' + ', '.join(algorithms))
  overrides = {}
  if len(parts) == 3 and parts[2]:
    for item in parts[2].split(';'):
      key, sep, value = item.partition('=')
      if not sep:
        raise ValueError(f'--benchmark_config={spec!r}: {item!r} is not FLAG=VALUE')
      overrides[key.strip()] = value.strip()
  return Config(name, algorithm, overrides)


def select(task_name: str, names: Optional[Sequence[str]], custom: Sequence[str],
           algorithms: Sequence[str]) -> list[Config]:
  """The presets named (default: the task's) plus the custom specs."""
  if names is None:
    names = TASK_PRESETS.get(task_name, DEFAULT_PRESETS)
  configs = []
  for name in names:
    if name not in PRESETS:
      raise ValueError(f'--benchmark_configs: unknown preset {name!r}; valid values: '
                       + ', '.join(PRESETS))
    configs.append(PRESETS[name])
  configs += [parse_custom(s, algorithms) for s in custom]
  seen = set()
  for c in configs:
    if c.name in seen:
      raise ValueError(f'configuration name {c.name!r} given twice')
    seen.add(c.name)
  return configs
