"""Sweep specs: base training flags, a grid of configs, seeds, a learning-rate search.

A spec is a small JSON object (`load_spec`); the sweep binary may add to it
from its own flags (`merge_overrides`). Example:

  {
    "name": "fedpt_table1",
    "base": {"task": "emnist_cnn_gn", "total_rounds": 200, "clients_per_round": 10},
    "configs": [
      {"name": "fedavg", "flags": {"algorithm": "fedavg"}},
      {"name": "fedpt_dense1", "flags": {"algorithm": "fedpt", "frozen_layers": ["dense1"]}}
    ],
    "grid": {"client_epochs": [1, 2]},
    "seeds": [0, 1, 2],
    "lr_search": {"grid": {"client_learning_rate": [0.01, 0.03, 0.1]},
                  "flags": {"total_rounds": 50}, "seeds": [0]}
  }

Configs: every entry of `configs` (default: one unnamed config) crossed with
the top-level `grid` (their cartesian product), and each entry with its own
`grid` too. A config's flags are `base`, then its own `flags`, then its grid
values. Its name is the entry's name followed by `+flag=value` per grid value.

Learning-rate search (`lr_search`): per config, every combination of its
`grid` (usually client and server learning rates; any training flag may be
tuned, e.g. `clip_norm` under DP) is trained with `flags` on top of the
config's, for each of its `seeds`, evaluating on a validation split of the
training clients' examples (`--eval_split=validation`), never on the test
clients. The combination with the best mean final validation `metric` is
used by the config's runs. A config entry may say `"lr_search": false` (keep
its flags' values), `"lr_search": {"grid": {...}}` (search this grid instead,
e.g. the clip norm too for a DP config), or `"lr_from": "<config name>"` (use
that config's chosen values, e.g. every federated select config at FedAvg's
tuned rates). The top-level `lr_search` may then leave out `grid` when no
config searches it (each has its own grid, `false` or `lr_from`).

A spec file may start from another (`"extends"`, resolved by `load_spec`),
e.g. to run an earlier sweep on to more rounds:

  {"extends": "fedpt_table1.json", "name": "fedpt_table1_1500",
   "description": "...", "base": {"total_rounds": 1500}}

or to change one config and leave out another, by name, without restating
the rest (`"update_configs"`, `"drop_configs"`):

  {"extends": "fedpt_table1.json", "name": "fedpt_table1_wider",
   "description": "...", "drop_configs": ["fedavg"],
   "update_configs": [{"name": "fedpt_dense1",
                       "lr_search": {"grid": {"client_learning_rate": [0.1, 0.3]}}}]}

or to add a config after the parent's (`"add_configs"`, configs written out
as in `"configs"`, with names the parent does not use), e.g. a new arm whose
runs sit beside the parent's finished ones under `--resume_from`.
"""

import dataclasses
import hashlib
import itertools
import json
import os
import re
from typing import Any, Mapping, Optional, Sequence

# Flags the sweep sets on every run itself; a spec may not set them.
MANAGED_FLAGS = {
    'seed': 'the sweep gives each run its seed (use "seeds")',
    'root_output_dir': 'the sweep gives each run its own directory (use --sweep_dir)',
    'experiment_name': 'the sweep gives each run its own directory (use --sweep_dir)',
    'output_dir': 'not a training output',
    'dry_run': 'a sweep trains',
    'eval_split': 'the sweep evaluates final runs on test and searches on validation',
    'validation_fraction': 'set it as "validation_fraction" of "lr_search"',
    'workers': 'give the sweep --workers; it shares them out among parallel runs',
}
_SPEC_KEYS = ('name', 'description', 'base', 'configs', 'grid', 'seeds', 'lr_search',
              'summary')
_CONFIG_KEYS = ('name', 'flags', 'grid', 'lr_search', 'lr_from')
_LR_SEARCH_KEYS = ('grid', 'flags', 'seeds', 'validation_fraction', 'metric')
_SUMMARY_KEYS = ('metric', 'plateau_tolerance', 'plateau_window')
_NAME = re.compile(r'^[A-Za-z0-9_.=-]+$')


class SpecError(ValueError):
  """The spec is malformed; the message names the key and what is allowed."""


@dataclasses.dataclass(frozen=True)
class LrSearch:
  """Per config: `grid` combinations x `seeds`, trained with `flags` on validation.

  `metric`: the final validation metric to compare (`final_eval.json` key);
  `loss` is minimized, anything else maximized.
  """

  grid: Mapping[str, tuple]
  flags: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  seeds: tuple = (0,)
  validation_fraction: float = 0.1
  metric: str = 'accuracy'

  def trials(self, grid: Optional[Mapping[str, tuple]] = None) -> list:
    """Every combination of `grid` (default: the spec's), as (name, {flag: value})."""
    grid = self.grid if grid is None else grid
    names = list(grid)
    out = []
    for values in itertools.product(*(grid[n] for n in names)):
      assignment = dict(zip(names, values))
      out.append((_assignment_name(assignment), assignment))
    return out

  @property
  def maximize(self) -> bool:
    return self.metric != 'loss'


@dataclasses.dataclass(frozen=True)
class SummaryOptions:
  """How the summary reads curves (see `tff_partial.sweep.summary`)."""

  metric: str = 'accuracy'
  plateau_tolerance: float = 0.01
  plateau_window: int = 5


@dataclasses.dataclass(frozen=True)
class Config:
  """One point of the grid: the scripts.train flags of its runs (without seed).

  own_flags: the config's flags beyond the base (its identity in tables).
  tune: its learning rates are searched (`lr_search`), else kept as given.
  lr_from: another config whose searched values it uses.
  search_grid: the grid its search tries (the spec's unless the entry has its own).
  """

  name: str
  flags: Mapping[str, Any]
  own_flags: Mapping[str, Any]
  tune: bool
  lr_from: Optional[str] = None
  search_grid: Optional[Mapping[str, tuple]] = None


@dataclasses.dataclass(frozen=True)
class SweepSpec:
  """A validated spec. `to_dict()` is what the sweep manifest records."""

  name: str
  description: str
  base: Mapping[str, Any]
  configs: Sequence[Mapping[str, Any]]
  grid: Mapping[str, tuple]
  seeds: tuple
  lr_search: Optional[LrSearch]
  summary: SummaryOptions

  def to_dict(self) -> dict:
    out = {
        'name': self.name, 'description': self.description, 'base': dict(self.base),
        'configs': [dict(c) for c in self.configs],
        'grid': {k: list(v) for k, v in self.grid.items()}, 'seeds': list(self.seeds),
        'summary': dataclasses.asdict(self.summary),
    }
    if self.lr_search is not None:
      search = dataclasses.asdict(self.lr_search)
      search['grid'] = {k: list(v) for k, v in self.lr_search.grid.items()}
      search['seeds'] = list(self.lr_search.seeds)
      out['lr_search'] = search
    return out

  def digest(self) -> str:
    """Hash of what the runs compute (not the description or summary options)."""
    identity = {k: v for k, v in self.to_dict().items()
                if k not in ('name', 'description', 'summary')}
    blob = json.dumps(identity, sort_keys=True, separators=(',', ':'))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]

  def expand(self) -> list:
    """The configs: entries x top-level grid, each entry x its own grid."""
    configs = []
    top = list(self.grid)
    for entry in self.configs:
      own_grid = entry.get('grid', {})
      names = top + list(own_grid)
      values = [self.grid[n] for n in top] + [own_grid[n] for n in own_grid]
      for combination in itertools.product(*values):
        assignment = dict(zip(names, combination))
        own = dict(entry.get('flags', {}))
        own.update(assignment)
        merged = dict(self.base)
        merged.update(own)
        parts = [entry['name']] if entry.get('name') else []
        if assignment:
          parts.append(_assignment_name(assignment))
        name = '+'.join(parts) or 'default'
        lr_from = entry.get('lr_from')
        if lr_from is not None:
          # The target config with the same top-level grid values.
          top_values = {n: assignment[n] for n in top}
          lr_from = '+'.join([lr_from] + ([_assignment_name(top_values)] if top_values else []))
        search = entry.get('lr_search', True)
        tune = self.lr_search is not None and search is not False and lr_from is None
        search_grid = None
        if tune:
          search_grid = self.lr_search.grid
          if isinstance(search, dict):
            search_grid = {k: tuple(v) for k, v in search['grid'].items()}
        configs.append(Config(
            name=name, flags=merged, own_flags=own, tune=tune, lr_from=lr_from,
            search_grid=search_grid))
    _check_configs(configs)
    return configs


def _value_text(value) -> str:
  if isinstance(value, bool):
    return 'true' if value else 'false'
  if isinstance(value, (list, tuple)):
    return ','.join(_value_text(v) for v in value)
  return str(value)


def _assignment_name(assignment: Mapping[str, Any]) -> str:
  # Names are directory names: a layer path's '/' becomes '.'.
  return '+'.join(f'{k}={_value_text(v)}'.replace('/', '.') for k, v in assignment.items())


def flag_argv(flag_values: Mapping[str, Any]) -> list:
  """`--name=value` arguments (lists comma-joined, bools true/false, None left out)."""
  return [f'--{k}={_value_text(v)}' for k, v in flag_values.items() if v is not None]


def _check_configs(configs) -> None:
  names = [c.name for c in configs]
  seen = set()
  for config in configs:
    if config.name in seen:
      raise SpecError(f'config name {config.name!r} appears twice; give the configs distinct names')
    seen.add(config.name)
    if not _NAME.match(config.name.replace('+', '').replace(',', '')):
      raise SpecError(f'config name {config.name!r} may hold only letters, digits and _.=-+,')
  by_name = {c.name: c for c in configs}
  for config in configs:
    if config.lr_from is None:
      continue
    target = by_name.get(config.lr_from)
    if target is None:
      raise SpecError(f'config {config.name!r}: "lr_from": no config named {config.lr_from!r} '
                      f'(configs: {", ".join(names)})')
    if not target.tune:
      raise SpecError(f'config {config.name!r}: "lr_from" names {config.lr_from!r}, whose '
                      'learning rates are not searched')


def _require(mapping, keys, where) -> None:
  if not isinstance(mapping, dict):
    raise SpecError(f'{where} must be a JSON object, not {type(mapping).__name__}')
  unknown = sorted(set(mapping) - set(keys))
  if unknown:
    raise SpecError(f'{where}: unknown key(s) {", ".join(map(repr, unknown))}; valid keys: '
                    + ', '.join(keys))


def _check_flags(flag_values, where) -> dict:
  if not isinstance(flag_values, dict):
    raise SpecError(f'{where} must map flag names to values')
  for name, value in flag_values.items():
    if name.startswith('-'):
      raise SpecError(f'{where}: write flag names without dashes ({name!r})')
    if name in MANAGED_FLAGS:
      raise SpecError(f'{where}: --{name} is set by the sweep: {MANAGED_FLAGS[name]}')
    scalar = (str, int, float, bool, type(None))
    if not (isinstance(value, scalar) or (
        isinstance(value, list) and all(isinstance(v, scalar) for v in value))):
      raise SpecError(f'{where}: --{name} has value {value!r}; use a JSON scalar or a list')
  return dict(flag_values)


def _check_grid(grid, where) -> dict:
  grid = _check_flags(grid, where)
  out = {}
  for name, values in grid.items():
    if not isinstance(values, list) or not values:
      raise SpecError(f'{where}: --{name} needs a non-empty list of values')
    if len(set(map(json.dumps, values))) != len(values):
      raise SpecError(f'{where}: --{name} lists a value twice')
    out[name] = tuple(values)
  return out


def _check_seeds(seeds, where) -> tuple:
  if (not isinstance(seeds, list) or not seeds
      or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
      or len(set(seeds)) != len(seeds)):
    raise SpecError(f'{where} must be a non-empty list of distinct integers >= 0, got {seeds!r}')
  return tuple(seeds)


def from_dict(data: Mapping[str, Any]) -> SweepSpec:
  """Validates a spec object (SpecError naming the key) into a `SweepSpec`."""
  _require(data, _SPEC_KEYS, 'the spec')
  name = data.get('name') or 'sweep'
  if not isinstance(name, str) or not _NAME.match(name):
    raise SpecError(f'"name" {name!r} may hold only letters, digits and _.=-')
  base = _check_flags(data.get('base', {}), '"base"')
  grid = _check_grid(data.get('grid', {}), '"grid"')
  configs = data.get('configs') or [{}]
  if not isinstance(configs, list):
    raise SpecError('"configs" must be a list of {"name", "flags", "grid", ...} objects')
  for i, entry in enumerate(configs):
    where = f'"configs"[{i}]'
    _require(entry, _CONFIG_KEYS, where)
    own = _check_flags(entry.get('flags', {}), f'{where}.flags')
    own_grid = _check_grid(entry.get('grid', {}), f'{where}.grid')
    overlap = sorted(set(own_grid) & (set(grid) | set(own)))
    if overlap:
      raise SpecError(f'{where}: --{overlap[0]} is in its grid and also in its flags or '
                      'the top-level grid')
    if overlap := sorted(set(grid) & set(own)):
      raise SpecError(f'{where}: --{overlap[0]} is set by the config and by the top-level grid')
    search = entry.get('lr_search', True)
    if isinstance(search, dict):
      _require(search, ('grid',), f'{where}.lr_search')
      if not _check_grid(search.get('grid', {}), f'{where}.lr_search.grid'):
        raise SpecError(f'{where}.lr_search.grid must name at least one flag to search')
    elif not isinstance(search, bool):
      raise SpecError(f'{where}.lr_search must be true, false or {{"grid": {{...}}}}')
    if entry.get('lr_from') is not None and not isinstance(entry['lr_from'], str):
      raise SpecError(f'{where}.lr_from must be a config name')
  seeds = _check_seeds(data.get('seeds', [0]), '"seeds"')
  lr_search = None
  if data.get('lr_search') is not None:
    raw = data['lr_search']
    _require(raw, _LR_SEARCH_KEYS, '"lr_search"')
    search_grid = _check_grid(raw.get('grid', {}), '"lr_search".grid')
    # The top-level grid may be left out when no config would search it: each
    # searched config has its own grid, or none is searched.
    first_user = next((i for i, entry in enumerate(configs)
                       if entry.get('lr_search', True) is True
                       and entry.get('lr_from') is None), None)
    if not search_grid and first_user is not None:
      config_name = configs[first_user].get('name') or 'default'
      raise SpecError('"lr_search".grid must name at least one flag to search, e.g. '
                      '{"client_learning_rate": [0.01, 0.1]}, unless every searched config '
                      f'has its own "lr_search": {{"grid": ...}} ("configs"[{first_user}] '
                      f'"{config_name}" has none)')
    fraction = raw.get('validation_fraction', 0.1)
    if not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
      raise SpecError(f'"lr_search".validation_fraction={fraction!r} must be in (0, 1)')
    metric = raw.get('metric', 'accuracy')
    if not isinstance(metric, str):
      raise SpecError('"lr_search".metric must be a final_eval.json key such as "accuracy"')
    lr_search = LrSearch(
        grid=search_grid,
        flags=_check_flags(raw.get('flags', {}), '"lr_search".flags'),
        seeds=_check_seeds(raw.get('seeds', [seeds[0]]), '"lr_search".seeds'),
        validation_fraction=float(fraction), metric=metric)
  summary_raw = data.get('summary', {})
  _require(summary_raw, _SUMMARY_KEYS, '"summary"')
  try:
    summary = SummaryOptions(**summary_raw)
  except TypeError as e:
    raise SpecError(f'"summary": {e}') from e
  if not (summary.plateau_tolerance > 0 and int(summary.plateau_window) >= 1):
    raise SpecError('"summary": plateau_tolerance must be > 0 and plateau_window >= 1')
  spec = SweepSpec(
      name=name, description=str(data.get('description', '')), base=base,
      configs=[dict(c) for c in configs], grid=grid, seeds=seeds,
      lr_search=lr_search, summary=summary)
  spec.expand()  # name clashes and lr_from targets
  return spec


def _read_json_object(path: str) -> dict:
  try:
    with open(path) as f:
      data = json.load(f)
  except OSError as e:
    raise SpecError(f'--spec={path}: {e.strerror}') from e
  except ValueError as e:
    raise SpecError(f'--spec={path} is not valid JSON: {e}') from e
  if not isinstance(data, dict):
    raise SpecError(f'--spec={path} must hold a JSON object')
  return data


def _named_objects(value: Any) -> bool:
  """Whether `value` is a list of JSON objects, each with a string "name"."""
  return isinstance(value, list) and all(
      isinstance(v, dict) and isinstance(v.get('name'), str) for v in value)


def _update_parent_configs(path: str, parent_configs: Any, drop: Any, update: Any,
                           add: Any) -> list:
  """The parent's `configs` less `drop` (names), with `update` applied by name,
  then `add` (new configs) after them.

  Each entry of `update` names a parent config: its `flags` are added to (or
  replace) that config's flags, any other key it gives replaces the config's,
  and a value of null removes the flag or key. Order stays the parent's. Each
  entry of `add` is a whole config (checked later with the rest) whose name
  no parent config has. Configs may share a name (e.g. one method at two
  learning rates, each with its own grid): every parent config kept, and
  `drop` and `update` act on every config of the name.
  """
  if not _named_objects(parent_configs):
    raise SpecError(f'--spec={path}: "update_configs" / "drop_configs" / "add_configs" need a '
                    'parent spec whose "configs" are named')
  # Freshly read by load_spec: ours to change. A list, not a dict by name:
  # configs that share a name are all kept.
  configs = list(parent_configs)
  known = dict.fromkeys(c['name'] for c in configs)  # each name once, in order
  names = ', '.join(known)
  if not isinstance(drop, list) or not all(isinstance(n, str) for n in drop):
    raise SpecError(f'--spec={path}: "drop_configs" must be a list of config names')
  if not _named_objects(update):
    raise SpecError(f'--spec={path}: "update_configs" must be a list of objects with a "name"')
  for name in list(drop) + [u['name'] for u in update]:
    if name not in known:
      raise SpecError(f'--spec={path}: no config {name!r} in the parent spec; its configs: '
                      f'{names}')
  for entry in update:
    if entry['name'] in drop:
      raise SpecError(f'--spec={path}: config {entry["name"]!r} is both updated and dropped')
    for config in (c for c in configs if c['name'] == entry['name']):
      for key, value in entry.items():
        if key == 'flags' and isinstance(value, dict):
          flags = {**config.get('flags', {}), **value}
          config['flags'] = {k: v for k, v in flags.items() if v is not None}
        elif value is None:
          config.pop(key, None)
        else:
          config[key] = value
  if not _named_objects(add):
    raise SpecError(f'--spec={path}: "add_configs" must be a list of configs, each with a '
                    '"name"')
  for entry in add:
    if entry['name'] in known:
      raise SpecError(f'--spec={path}: "add_configs": the parent spec already has a config '
                      f'{entry["name"]!r} (change it with "update_configs")')
  return [c for c in configs if c['name'] not in drop] + list(add)


def load_spec(path: str, _seen: tuple = ()) -> dict:
  """The JSON object in `path` (SpecError if unreadable), its `"extends"` resolved.

  `"extends": "<spec file>"` (a path relative to this file) starts from that
  spec: this file's `"base"` flags are added to (or replace) the parent's, and
  any other key it gives replaces the parent's whole. A spec that runs an
  earlier one on to more rounds is then its name, description and
  `"base": {"total_rounds": N}`. Instead of replacing `"configs"` whole,
  `"drop_configs"` (names) leaves parent configs out, `"update_configs"`
  changes parent configs by name and `"add_configs"` appends new ones
  (`_update_parent_configs`). The result is the full spec, with the same
  digest as the same spec written out whole.
  """
  data = _read_json_object(path)
  parent = data.pop('extends', None)
  drop = data.pop('drop_configs', None)
  update = data.pop('update_configs', None)
  add = data.pop('add_configs', None)
  changes = (drop, update, add)
  if parent is None:
    if any(c is not None for c in changes):
      raise SpecError(f'--spec={path}: "update_configs", "drop_configs" and "add_configs" '
                      'change the configs of the spec named by "extends"; this spec extends '
                      'none')
    return data
  if not isinstance(parent, str):
    raise SpecError(f'--spec={path}: "extends" must be the path of another spec file')
  parent_path = os.path.normpath(os.path.join(os.path.dirname(path), parent))
  if os.path.realpath(parent_path) in _seen + (os.path.realpath(path),):
    raise SpecError(f'--spec={path}: "extends" makes a cycle through {parent_path}')
  if not os.path.isfile(parent_path):
    raise SpecError(f'--spec={path}: "extends": {parent_path} is not a file (the path is '
                    'relative to the extending spec)')
  merged = load_spec(parent_path, _seen + (os.path.realpath(path),))
  if any(c is not None for c in changes):
    if 'configs' in data:
      raise SpecError(f'--spec={path}: give either "configs" (replacing the parent\'s whole) '
                      'or "update_configs" / "drop_configs" / "add_configs", not both')
    merged['configs'] = _update_parent_configs(
        path, merged.get('configs'), *([] if c is None else c for c in changes))
  for key, value in data.items():
    if key == 'base' and isinstance(value, dict) and isinstance(merged.get('base'), dict):
      merged['base'] = {**merged['base'], **value}
    else:
      merged[key] = value
  return merged


def _parse_assignment(text: str, flag: str):
  name, sep, value = text.partition('=')
  if not sep or not name:
    raise SpecError(f'--{flag}={text!r}: expected flag=value')
  return name.lstrip('-'), value


def merge_overrides(
    data: Mapping[str, Any],
    *,
    name: Optional[str] = None,
    set_flags: Sequence[str] = (),
    grid: Sequence[str] = (),
    seeds: Optional[Sequence[int]] = None,
    lr_grid: Sequence[str] = (),
) -> dict:
  """`data` with the sweep binary's repeatable flags applied on top.

  set_flags: `flag=value` added to (or replacing in) "base".
  grid: `flag=v1,v2,...` added to the top-level "grid" (values split at commas;
    list-valued flags need a spec file).
  lr_grid: `flag=v1,v2,...` added to "lr_search".grid.
  Values from the command line stay strings; scripts.train parses them.
  """
  data = json.loads(json.dumps(dict(data)))  # a deep copy
  if name:
    data['name'] = name
  for text in set_flags:
    key, value = _parse_assignment(text, 'set')
    data.setdefault('base', {})[key] = value
  for text in grid:
    key, value = _parse_assignment(text, 'grid')
    data.setdefault('grid', {})[key] = value.split(',')
  if seeds:
    data['seeds'] = list(seeds)
  for text in lr_grid:
    key, value = _parse_assignment(text, 'lr_grid')
    data.setdefault('lr_search', {}).setdefault('grid', {})[key] = [
        float(v) if _is_number(v) else v for v in value.split(',')]
  return data


def _is_number(text: str) -> bool:
  try:
    float(text)
    return True
  except ValueError:
    return False
