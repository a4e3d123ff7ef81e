"""A whole sweep: check everything, run the search and the runs, then summarize.

`prepare` does every check before anything runs (spec, sweep directory,
each config's training flags through `TrainInterface.check_fn`); `run` runs
what is not finished yet and writes the summary; `summarize` only reads.
"""

import dataclasses
import fnmatch
import functools
import os
import shutil
from typing import Callable, Optional, Sequence

from tff_partial.sweep import carry as carry_lib
from tff_partial.sweep import lr_search
from tff_partial.sweep import manifest
from tff_partial.sweep import plan
from tff_partial.sweep import plots
from tff_partial.sweep import runner
from tff_partial.sweep import spec as spec_lib
from tff_partial.sweep import summary
from tff_partial.training import resumable


class CheckError(ValueError):
  """A config's training flags are rejected by the training binary's own checks."""


@dataclasses.dataclass(frozen=True)
class TrainInterface:
  """How the sweep starts and checks training runs.

  command: the argv prefix of a run, e.g. `[python, '-m', 'scripts.train']`.
  check_fn: list of training argv lists -> (per argv an error line or None,
    the binary's --total_rounds default); it must check without building
    anything (the binary's own flag validation).
  """

  command: Sequence[str]
  check_fn: Callable[[list], tuple]


@dataclasses.dataclass(frozen=True)
class Prepared:
  """A checked sweep. resumed: its directory already holds this spec's sweep.

  carry: the runs to copy from an earlier sweep before anything runs
  (`resume_from`), or None. carry_note: a line saying that `resume_from`
  came from the sweep's manifest, not from the caller, or None.
  search_history: (sweep_dir, runs) of earlier sweeps whose search trials
  outside this grid the search tables show too (`lr_search.earlier_trials`).
  """

  spec: spec_lib.SweepSpec
  sweep_dir: str
  configs: list
  runs: list
  resumed: bool
  default_total_rounds: int
  carry: Optional[carry_lib.CarryPlan] = None
  carry_note: Optional[str] = None
  search_history: tuple = ()


def _only(configs, runs, patterns: Sequence[str]) -> tuple:
  """The configs whose names match a pattern (fnmatch), their runs and their searches."""
  chosen = [c for c in configs if any(fnmatch.fnmatchcase(c.name, p) for p in patterns)]
  if not chosen:
    raise spec_lib.SpecError(
        f'--only={",".join(patterns)} matches no config; configs: '
        + ', '.join(c.name for c in configs))
  names = {c.name for c in chosen}
  searched = {r.tuned_by for r in runs if not r.is_search and r.config in names}
  return chosen, [r for r in runs
                  if r.config in (searched if r.is_search else names)]


def prepare(spec: spec_lib.SweepSpec, sweep_dir: str, train: TrainInterface,
            only: Sequence[str] = (), resume_from: Optional[str] = None,
            search_history: Sequence[str] = ()) -> Prepared:
  """Every check, before anything runs or is written; raises with one clear line.

  A sweep directory that holds this spec's manifest passed the checks when it
  was written; they are not run again. `only`: fnmatch patterns of config
  names; just those configs (and the searches they need) run and are
  summarized. Every config is checked all the same, and the sweep directory
  stays the whole spec's. `resume_from`: an earlier sweep's directory whose
  runs this one starts from where their flags allow (`tff_partial.sweep.carry`).
  A rerun without it uses the one the sweep started with (recorded in its
  manifest), so that the runs whose copy waits for their search are still
  copied; if that directory is gone, they train. `search_history`: earlier
  sweeps' directories (`Prepared.search_history`), e.g. the chain of specs
  that widened a grid; nothing is copied from them.
  """
  prepared = _prepare(spec, sweep_dir, train, only)
  note = None
  if resume_from is None and prepared.resumed:
    resume_from, note = _recorded_resume_from(sweep_dir)
  carry = None if resume_from is None else carry_lib.plan_copies(
      resume_from, sweep_dir, prepared.runs)
  history = tuple((d, carry_lib.planned_runs(d, flag='search_history'))
                  for d in search_history)
  return dataclasses.replace(prepared, carry=carry, carry_note=note, search_history=history)


def _recorded_resume_from(sweep_dir: str) -> tuple:
  """(the `resume_from` in the manifest if its directory is still there, a line saying so)."""
  recorded = manifest.recorded_resume_from(sweep_dir)
  if recorded is None:
    return None, None
  if not os.path.isdir(recorded):
    return None, (f'this sweep started from --resume_from={recorded}, which is gone: runs not '
                  'copied yet train from scratch')
  return recorded, f'--resume_from={recorded}: from the sweep manifest (the sweep started from it)'


def _prepare(spec, sweep_dir, train, only) -> Prepared:
  configs = spec.expand()
  resumed = manifest.check(sweep_dir, spec)
  rounds = manifest.read(sweep_dir).get('default_total_rounds') if resumed else None
  if rounds is not None:
    runs = plan.plan_runs(spec, configs, rounds)
    if only:
      configs, runs = _only(configs, runs, only)
    return Prepared(spec, sweep_dir, configs, runs, resumed=True, default_total_rounds=rounds)
  runs = plan.plan_runs(spec, configs, default_total_rounds=0)  # known after the check
  if only:
    _only(configs, runs, only)  # a pattern that matches nothing fails before the check
  # One argv per config and per search trial (seeds change nothing the checks see).
  by_name = {c.name: c for c in configs}
  checked, seen = [], set()
  for run in runs:
    key = (run.config, run.trial)
    if key in seen:
      continue
    seen.add(key)
    tuned = None
    if run.tuned_by is not None:  # any grid point: the same flag names
      tuned = spec.lr_search.trials(by_name[run.tuned_by].search_grid)[0][1]
    checked.append((run, plan.train_argv(sweep_dir, run, tuned)))
  errors, default_total_rounds = train.check_fn([argv for _, argv in checked])
  for (run, _), error in zip(checked, errors):
    if error:
      where = f'config {run.config}' + (f', search trial {run.trial}' if run.is_search else '')
      raise CheckError(f'{where}: {error}')
  runs = plan.plan_runs(spec, configs, default_total_rounds)
  if only:
    configs, runs = _only(configs, runs, only)
  return Prepared(spec, sweep_dir, configs, runs, resumed=resumed,
                  default_total_rounds=default_total_rounds)


def search_runs(prepared: Prepared) -> list:
  """The learning-rate search runs (`--search_only`); SpecError if there are none."""
  runs = [r for r in prepared.runs if r.is_search]
  if not runs:
    raise spec_lib.SpecError(
        '--search_only: no config of this sweep has a learning-rate search (the spec '
        'needs "lr_search" and a config with "tune")')
  return runs


class _Choices:
  """Each searched config's chosen values, read once its search runs finished."""

  def __init__(self, prepared: Prepared):
    self._p = prepared
    self._cache = {}

  def get(self, config: str) -> lr_search.Choice:
    if config not in self._cache:
      search = self._p.spec.lr_search
      choice = lr_search.choose(self._p.sweep_dir, self._p.runs, config, search)
      if self._p.search_history:
        choice = dataclasses.replace(choice, earlier=lr_search.earlier_trials(
            self._p.search_history, self._p.runs, config, search.metric))
      self._cache[config] = choice
    return self._cache[config]

  def available(self) -> dict:
    """Choices of every searched config whose search can be read (for the summary)."""
    out = {}
    for config in self._p.configs:
      if config.tune:
        try:
          out[config.name] = self.get(config.name)
        except ValueError:
          pass
    return out


def bank(prepared: Prepared, bank_dir: str, runs: Optional[Sequence[plan.Run]] = None,
         checkpoints: bool = False, final_checkpoints: bool = False) -> list:
  """Banks the runs (default: all of the sweep's) in `bank_dir`; the run ids copied.

  `tff_partial.sweep.carry.bank_runs`: the finished runs without checkpoints
  or weights and, with `checkpoints`, the unfinished ones with their latest
  checkpoint; with `final_checkpoints`, the finished ones with their final
  checkpoint, to train on to more rounds; a directory to commit, which
  `--resume_from=<bank_dir>` takes back.
  The bank records the sweep's `resume_from`, so that the runs still waiting
  for their search to choose are copied from there by a sweep resumed from
  the bank.
  """
  return carry_lib.bank_runs(prepared.sweep_dir, bank_dir, prepared.spec,
                             prepared.default_total_rounds,
                             prepared.runs if runs is None else runs, checkpoints=checkpoints,
                             resume_from=prepared.carry.source_dir if prepared.carry else None,
                             final_checkpoints=final_checkpoints)


def check_bank(prepared: Prepared, bank_dir: str) -> None:
  """SweepDirError (one line) unless `bank_dir` can bank this sweep's runs; writes nothing."""
  carry_lib.check_bank(prepared.sweep_dir, bank_dir, prepared.spec)


def run(prepared: Prepared, train: TrainInterface, *, parallel: int = 1,
        workers: Sequence[str] = (), print_fn=print, summary_dir: Optional[str] = None,
        interactive: Optional[bool] = None, search_only: bool = False,
        bank_dir: Optional[str] = None, bank_checkpoints: bool = False,
        bank_final_checkpoints: bool = False) -> tuple:
  """Runs every unfinished run, then summarizes: (SweepReport, summary paths).

  search_only: run only the learning-rate searches (`scripts.sweep
  --search_only`), to see each choice and any grid-edge warning before paying
  for the full runs; the same sweep without it reuses the finished searches.
  bank_dir: every finished run is banked there (`bank`): those finished
  before at the start, the others as each finishes. bank_checkpoints: the
  unfinished runs too, with their latest checkpoint, once the runs stop (the
  sweep ends or is stopped by a signal). bank_final_checkpoints: each finished
  run with its final checkpoint.
  """
  choices = _Choices(prepared)
  runs = search_runs(prepared) if search_only else prepared.runs
  announced = set()

  def command(r: plan.Run) -> list:
    tuned = None
    if r.tuned_by is not None:
      try:
        choice = choices.get(r.tuned_by)
      except ValueError as e:
        raise runner.SkipRun(str(e)) from e
      tuned = choice.values
      if r.tuned_by not in announced:
        # Said when the first run it tunes starts, not only after the whole
        # sweep: a choice at its grid's edge can be widened before hours of
        # full runs are spent on it.
        announced.add(r.tuned_by)
        for line in _choice_lines(prepared, r.tuned_by, choice, search_only=False):
          sweep_runner.note(line)
      if (carry_lib.copy_if_same_choice(prepared.carry, prepared.sweep_dir, r, tuned)
          and plan.is_finished(prepared.sweep_dir, r)):
        # Named by the sweep it came from, which may be earlier in the chain.
        source = prepared.carry.if_same_choice[r.run_id].source_dir
        raise runner.AlreadyFinished(f'copied from {source}: its search chose the same values')
    return list(train.command) + plan.train_argv(prepared.sweep_dir, r, tuned)

  with manifest.Lock(prepared.sweep_dir):
    on_done = None
    if bank_dir is not None:  # first: a bank of another spec stops before the manifest
      bank_now = functools.partial(bank, prepared, bank_dir,
                                   final_checkpoints=bank_final_checkpoints)
      print_fn(f'--bank_dir={bank_dir}: {len(bank_now())} finished run(s) '
               'banked now; the others are banked as they finish')

      def on_done(finished_run: plan.Run) -> None:
        bank_now([finished_run])
    manifest.write(prepared.sweep_dir, prepared.spec, prepared.default_total_rounds,
                   resume_from=prepared.carry.source_dir if prepared.carry else None)
    if prepared.carry_note is not None:
      print_fn(prepared.carry_note)
    if prepared.carry is not None:
      copied = carry_lib.copy_runs(prepared.carry, prepared.sweep_dir)
      print_fn(f'{carry_lib.describe(prepared.carry)}; {len(copied)} copied now')
    sweep_runner = runner.Runner(
        prepared.sweep_dir, runs, command, parallel=parallel, workers=workers,
        name=prepared.spec.name, print_fn=print_fn, interactive=interactive,
        on_done=on_done)
    try:
      report = sweep_runner.run()
    finally:  # also on a signal, once the runs have stopped
      if bank_dir is not None:  # and the runs copied from an earlier sweep as they started
        banked = bank_now(checkpoints=bank_checkpoints)
        print_fn(f'--bank_dir={bank_dir}: {len(banked)} run(s) banked at the end'
                 + (' (unfinished ones with their latest checkpoint)' if bank_checkpoints
                    else ''))
  for run_id, reason in report.reasons.items():
    print_fn(f'{report.states[run_id]}: {run_id}: {reason}')
  for config, choice in choices.available().items():  # again at the end, for the record
    for line in _choice_lines(prepared, config, choice, search_only):
      print_fn(line)
  return report, summarize(prepared, summary_dir=summary_dir, choices=choices)


def _choice_lines(prepared: Prepared, config: str, choice: lr_search.Choice,
                  search_only: bool) -> list:
  """What the search of `config` chose; its grid (`search_only`); an edge warning."""
  seeds = len(choice.trials[0].scores)
  lines = [f'the search of {config} chose {choice.values_text()} '
           f'(validation {prepared.spec.lr_search.metric} {choice.score:.4f}, '
           + ('one seed)' if seeds == 1 else f'mean over {seeds} seeds)')]
  if search_only:  # the grid, to judge where the choice sits before the full runs
    lines += summary.search_table(choice, prepared.spec.lr_search.metric)
  if choice.at_edge:
    lines.append(f'warning: the search of {config} chose a value at its grid\'s edge: '
                 f'{choice.edge_text()}; widen the grid (docs/sweeps.md)')
  return lines


CURVES_DIR = 'curves'  # in the summary directory: each finished run's metrics.csv


def summarize(prepared: Prepared, *, summary_dir: Optional[str] = None,
              choices: Optional[_Choices] = None) -> dict:
  """Tables, plots and curves (`CURVES_DIR`) of the finished runs; paths by kind."""
  spec, sweep_dir = prepared.spec, prepared.sweep_dir
  options = spec.summary
  choices = (choices or _Choices(prepared)).available()
  summaries, results, finished = [], [], []
  for config in prepared.configs:
    config_runs = [r for r in prepared.runs if r.config == config.name and not r.is_search]
    read = [(r, summary.read_run(sweep_dir, r, options.metric)) for r in config_runs]
    config_results = [x for _, x in read if x is not None]
    finished += [r for r, x in read if x is not None]
    results += config_results
    tuned_by = config.name if config.tune else config.lr_from
    summaries.append(summary.summarize_config(
        config, config_runs, config_results, metric=options.metric,
        tolerance=options.plateau_tolerance, window=int(options.plateau_window),
        choice=choices.get(tuned_by)))
  out_dir = summary_dir or os.path.join(sweep_dir, plan.SUMMARY_DIR)
  paths = summary.write(
      out_dir, name=spec.name, description=spec.description, summaries=summaries,
      results=results, choices=choices, metric=options.metric,
      tolerance=options.plateau_tolerance, window=int(options.plateau_window),
      search_metric=spec.lr_search.metric if spec.lr_search else options.metric)
  for path in plots.write(out_dir, summaries, metric=options.metric, title=spec.name):
    paths[os.path.splitext(os.path.basename(path))[0]] = path
  if finished:
    paths['curves'] = _copy_curves(sweep_dir, finished, os.path.join(out_dir, CURVES_DIR))
  return paths


def _copy_curves(sweep_dir: str, runs: Sequence[plan.Run], curves_dir: str) -> str:
  """Each of `runs`' metrics.csv as `curves_dir/<config>_seed<s>.csv`; `curves_dir`.

  So that a summary written into the repository (`--summary_dir=docs/results/...`)
  keeps every run's curve when the sweep directory is gone.
  """
  os.makedirs(curves_dir, exist_ok=True)
  for run in runs:
    shutil.copyfile(os.path.join(plan.run_dir(sweep_dir, run), resumable.METRICS_FILE),
                    os.path.join(curves_dir, f'{run.config}_seed{run.seed}.csv'))
  return curves_dir
