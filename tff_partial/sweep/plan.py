"""The runs of a sweep and where each one lives.

Under the sweep directory:
  sweep.json                                 the manifest (`tff_partial.sweep.manifest`)
  lr_search/<config>/<trial>/seed_<s>/       learning-rate search runs (validation split)
  runs/<config>/seed_<s>/                    the config's runs (test clients)
  logs/<same path>.log                       each run's stdout and stderr
  summary/                                   tables and plots

Every run directory is a `scripts.train` output directory
(`--root_output_dir=<parent> --experiment_name=<seed_s>`); a run is finished
when it holds `final_eval.json`, which the training loop writes last.
"""

import dataclasses
import os
from typing import Any, Mapping, Optional

from tff_partial.sweep import spec as spec_lib
from tff_partial.training import resumable

SEARCH_DIR = 'lr_search'
RUNS_DIR = 'runs'
LOGS_DIR = 'logs'
SUMMARY_DIR = 'summary'
FINISHED_FILE = resumable.FINAL_EVAL_FILE


@dataclasses.dataclass(frozen=True)
class Run:
  """One `scripts.train` run of a sweep.

  flags: the config's training flags (not seed, outputs or evaluation split).
  trial / trial_flags: search runs: the grid point they try.
  tuned_by: runs of a searched config: the config whose search chooses the
    values of the searched flags (itself, or its `lr_from`).
  """

  run_id: str
  config: str
  seed: int
  flags: Mapping[str, Any]
  total_rounds: int
  trial: Optional[str] = None
  trial_flags: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  validation_fraction: Optional[float] = None
  tuned_by: Optional[str] = None

  @property
  def is_search(self) -> bool:
    return self.trial is not None


def plan_runs(spec: spec_lib.SweepSpec, configs, default_total_rounds: int) -> list:
  """Search runs (config by config), then the configs' runs (seed by seed).

  Seed-major order: an interrupted sweep has every config at its first seeds.
  """
  runs = []
  search = spec.lr_search
  for config in configs:
    if not config.tune:
      continue
    flags = dict(config.flags)
    flags.update(search.flags)
    rounds = int(flags.get('total_rounds', default_total_rounds))
    for trial, assignment in search.trials(config.search_grid):
      for seed in search.seeds:
        runs.append(Run(
            run_id=os.path.join(SEARCH_DIR, config.name, trial, f'seed_{seed}'),
            config=config.name, seed=seed, flags=flags, total_rounds=rounds,
            trial=trial, trial_flags=assignment,
            validation_fraction=search.validation_fraction))
  for seed in spec.seeds:
    for config in configs:
      tuned_by = config.name if config.tune else config.lr_from
      runs.append(Run(
          run_id=os.path.join(RUNS_DIR, config.name, f'seed_{seed}'),
          config=config.name, seed=seed, flags=dict(config.flags),
          total_rounds=int(config.flags.get('total_rounds', default_total_rounds)),
          tuned_by=tuned_by))
  return runs


def dependencies(run: Run, runs) -> list:
  """The run ids that must finish before `run` starts (its config's search)."""
  if run.tuned_by is None:
    return []
  return [r.run_id for r in runs if r.is_search and r.config == run.tuned_by]


def run_dir(sweep_dir: str, run: Run) -> str:
  return os.path.join(sweep_dir, run.run_id)


def log_path(sweep_dir: str, run: Run) -> str:
  return os.path.join(sweep_dir, LOGS_DIR, run.run_id + '.log')


def is_finished(sweep_dir: str, run: Run) -> bool:
  return os.path.exists(os.path.join(run_dir(sweep_dir, run), FINISHED_FILE))


def train_flags(run: Run, tuned: Optional[Mapping[str, Any]] = None) -> dict:
  """Every training flag of `run` but its output directory."""
  flags = dict(run.flags)
  if run.is_search:
    flags.update(run.trial_flags)
    flags['eval_split'] = 'validation'
    flags['validation_fraction'] = run.validation_fraction
  elif run.tuned_by is not None:
    if tuned is None:
      raise ValueError(f'{run.run_id} needs the values chosen by the search of {run.tuned_by}')
    flags.update(tuned)
  flags['seed'] = run.seed
  return flags


def train_argv(sweep_dir: str, run: Run, tuned: Optional[Mapping[str, Any]] = None) -> list:
  """scripts.train arguments of `run` (`tuned`: the searched values it uses)."""
  directory = run_dir(sweep_dir, run)
  return spec_lib.flag_argv(train_flags(run, tuned)) + [
      f'--root_output_dir={os.path.dirname(directory)}',
      f'--experiment_name={os.path.basename(directory)}',
  ]
