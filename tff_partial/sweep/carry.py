"""Starting a sweep from the runs of an earlier one (`scripts.sweep --resume_from`).

The typical use: a finished 400-round sweep run on to 1,500 rounds by a spec
that differs from it only in `total_rounds` (written with `"extends"`,
`tff_partial.sweep.spec.load_spec`). Every run of the new sweep that the
earlier sweep has under the same run id, with the same training flags up to
those a run may change when it resumes (`RESUMABLE_FLAG_CHANGES`, e.g.
--total_rounds), is copied into the new sweep directory with its log. A
copied run that trained fewer rounds than the new sweep asks for loses its
final outputs, so that it resumes from its last checkpoint instead of counting
as finished; `scripts.train` checks the flags once more when it resumes.

Search runs are copied only when their flags are the same, rounds included;
a run of a searched config at once only when every search run its values come
from was copied too, so that the search chooses the same values it was
trained with. When the new search has runs of its own (a grid extended past
the value the earlier search chose at its edge), the config's runs are
copied later, when their search has finished, and only if it chose the
values they trained with (`copy_if_same_choice`). The same holds for runs
that the earlier sweep trained at fixed values of the flags the new search
chooses (a learning rate pinned there, searched here). Runs that are not copied
run from scratch. Nothing is ever overwritten: a run directory that exists
already in the new sweep is left as it is.

A bank (`bank_runs`, `scripts.sweep --bank_dir`) is a sweep directory that
holds the finished runs without their checkpoints and model weights, and
optionally the unfinished runs with their latest checkpoint: small enough to
commit, so that the runs of a sweep that takes more than one session survive
a fresh checkout, which `--resume_from=<bank>` takes them back into. A bank
records the sweep's own `--resume_from` (relative to the bank), and a run
that the bank lacks is looked for there too, so that the runs still waiting
for their search to choose are not trained again. A banked finished run
trains on to more rounds only if it was banked with its final checkpoint
(`final_checkpoints`, `scripts.sweep --bank_final_checkpoints`); without it,
a sweep that asks for more trains it from scratch.
"""

import dataclasses
import os
import shutil
from typing import Any, Callable, Mapping, Optional, Sequence

from tff_partial.sweep import manifest
from tff_partial.sweep import plan
from tff_partial.sweep import spec as spec_lib
from tff_partial.training import resumable

_COPYING_SUFFIX = '.copying'


@dataclasses.dataclass(frozen=True)
class Copy:
  """One run to copy: from `source` (a run directory of the earlier sweep).

  resume: the run trains on (its final outputs are dropped from the copy).
  """

  run: plan.Run
  source: str
  resume: bool
  source_dir: str  # the earlier sweep directory `source` is in (its logs are there)


@dataclasses.dataclass(frozen=True)
class CarryPlan:
  """What `--resume_from` copies, and why each other run of the new sweep is not copied."""

  source_dir: str
  copies: list
  not_copied: dict  # run id -> reason
  # run id -> Copy, copied when the run starts if its search chose its values.
  if_same_choice: dict = dataclasses.field(default_factory=dict)
  # The sweeps `source_dir` started from, looked in for runs it lacks (`_source_chain`).
  earlier_sources: tuple = ()


def _flags_except_resumable(run: plan.Run) -> dict:
  # The searched values are left out here: they are compared through the search runs.
  flags = plan.train_flags(run, tuned={})
  return {k: v for k, v in flags.items() if k not in resumable.RESUMABLE_FLAG_CHANGES}


def _differences(old: plan.Run, new: plan.Run) -> list:
  a, b = _flags_except_resumable(old), _flags_except_resumable(new)
  return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def _searched_flags(searches: Sequence[str], runs: Sequence[plan.Run]) -> set:
  """The flags whose values the search runs `searches` choose (empty if none).

  An earlier run that differs only in these (trained at a fixed learning
  rate, now searched) is copied once the search has chosen, if it chose the
  values the run trained with (`copy_if_same_choice` reads its flags.json).
  """
  ids = set(searches)
  return {k for r in runs if r.run_id in ids for k in r.trial_flags}


def _copy_of(run: plan.Run, old: plan.Run, source_dir: str) -> Copy:
  return Copy(run=run, source=plan.run_dir(source_dir, old),
              resume=old.total_rounds < run.total_rounds, source_dir=source_dir)


def planned_runs(sweep_dir: str, flag: str = 'resume_from') -> list:
  """Every run of the earlier sweep in `sweep_dir`, from its manifest (`plan.plan_runs`).

  Raises `manifest.SweepDirError`, naming `--<flag>`, when `sweep_dir` holds no
  readable manifest.
  """
  try:
    saved = manifest.read(sweep_dir)
    spec = spec_lib.from_dict(saved['spec'])
    rounds = int(saved['default_total_rounds'])
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise manifest.SweepDirError(
        f'--{flag}={sweep_dir} holds no readable {manifest.MANIFEST_FILE} ({e}); it '
        'must be the --sweep_dir of an earlier sweep') from e
  return plan.plan_runs(spec, spec.expand(), rounds)


def _source_chain(source_dir: str, sweep_dir: str) -> list:
  """`source_dir`, then the sweeps it started from (each manifest's `resume_from`), in order.

  A bank records the `--resume_from` of the sweep it banks, so a sweep resumed
  from the bank in a fresh checkout still finds the earlier runs that were
  waiting for their search to choose. Directories that are gone, repeat, or
  are `sweep_dir` itself end the chain.
  """
  chain, seen = [source_dir], {os.path.realpath(source_dir), os.path.realpath(sweep_dir)}
  while True:
    try:
      earlier = manifest.recorded_resume_from(chain[-1])
    except (OSError, ValueError):
      earlier = None
    if earlier is None or not os.path.isdir(earlier) or os.path.realpath(earlier) in seen:
      return chain
    seen.add(os.path.realpath(earlier))
    chain.append(earlier)


def plan_copies(source_dir: str, sweep_dir: str, runs: Sequence[plan.Run]) -> CarryPlan:
  """The runs of `runs` (the new sweep's) that can start from `source_dir`'s.

  A run that `source_dir` cannot give is looked for in the sweeps it started
  from (`_source_chain`); the reason given for a run copied from none is
  `source_dir`'s. Raises `manifest.SweepDirError` when `source_dir` is not a
  sweep directory or is the new sweep's own.
  """
  if os.path.realpath(source_dir) == os.path.realpath(sweep_dir):
    raise manifest.SweepDirError(
        f'--resume_from={source_dir} is --sweep_dir itself; a rerun of the same command '
        'resumes its runs without it')
  chain = [(d, {r.run_id: r for r in planned_runs(d)})
           for d in _source_chain(source_dir, sweep_dir)]
  copies, not_copied, later = {}, {}, {}
  for run in sorted(runs, key=lambda r: not r.is_search):  # searches first
    searches = plan.dependencies(run, runs)  # the search runs choosing its values, if any
    searched = _searched_flags(searches, runs)
    options = [_plan_one(run, old_runs.get(run.run_id), d, searches, searched, copies)
               for d, old_runs in chain]
    item, reason = next((o for o in options if o[1] is None),
                        next((o for o in options if o[0] is not None), options[0]))
    if reason is None:
      copies[run.run_id] = item
    else:
      not_copied[run.run_id] = reason
      if item is not None:
        later[run.run_id] = item
  return CarryPlan(source_dir=source_dir, copies=list(copies.values()), not_copied=not_copied,
                   if_same_choice=later, earlier_sources=tuple(d for d, _ in chain[1:]))


def _plan_one(run: plan.Run, old: Optional[plan.Run], source_dir: str, searches: Sequence[str],
              searched: set, copies: Mapping[str, Copy]) -> tuple:
  """(a Copy or None, None or why not copied now) for `run` from `source_dir`'s run `old`.

  searches: the search runs choosing `run`'s values; searched: the flags they
  choose. (copy, None): copy now; (copy, reason): copy when its search chose
  the values the earlier run trained with; (None, reason): do not copy.
  """
  if old is None:
    return None, 'not a run of the earlier sweep'
  if not os.path.isdir(plan.run_dir(source_dir, old)):
    return None, 'the earlier sweep has not started it'
  if old.is_search and (plan.train_flags(old) != plan.train_flags(run)
                        or old.total_rounds != run.total_rounds):
    return None, 'a search run with other flags (searches are copied only when identical)'
  diff = _differences(old, run)
  if diff and not set(diff) <= searched:
    return None, 'other flags: ' + ', '.join(f'--{k}' for k in diff)
  if (old.total_rounds < run.total_rounds
      and not os.path.isdir(os.path.join(plan.run_dir(source_dir, old),
                                         resumable.CHECKPOINTS_DIR))):
    return None, (f'the earlier run trained {old.total_rounds} rounds and has no checkpoints '
                  f'(a bank without --bank_final_checkpoints) to train on to {run.total_rounds}')
  if old.total_rounds > run.total_rounds:
    return None, f'the earlier run asks for {old.total_rounds} rounds, more than {run.total_rounds}'
  item = _copy_of(run, old, source_dir)
  if run.tuned_by is not None:
    # Copied at once only if its search comes whole from the same sweep (and
    # so chooses what it trained with); a search copied from a later sweep of
    # the chain may choose otherwise.
    missing = [s for s in searches if s not in copies or copies[s].source_dir != source_dir]
    if diff or missing:
      why = (f'the earlier run was trained at fixed {", ".join(f"--{k}" for k in diff)}, '
             f'which the search ({run.tuned_by}) now chooses' if diff else
             f'its search ({run.tuned_by}) is not copied whole')
      return item, (why + ': copied when that search has finished, if it chooses the values '
                    'this run trained with')
  return item, None


def _copy_file(source: str, target: str) -> None:
  os.makedirs(os.path.dirname(target), exist_ok=True)
  shutil.copy2(source, target + _COPYING_SUFFIX)
  os.replace(target + _COPYING_SUFFIX, target)


def copy_runs(carry: CarryPlan, sweep_dir: str) -> list:
  """Copies the planned runs whose directories do not exist yet; their run ids.

  Each run directory is copied under a temporary name and renamed into place,
  so an interrupted copy leaves no half run directory (its leftover is
  removed by the next call).
  """
  return [item.run.run_id for item in carry.copies if _copy_run(item, sweep_dir)]


def _copy_run(item: Copy, sweep_dir: str) -> bool:
  """Copies one run (and its log) unless its directory exists; whether it did."""
  target = plan.run_dir(sweep_dir, item.run)
  if os.path.exists(target):
    return False

  def drop_final_outputs(partial):
    if item.resume:
      for name in (resumable.FINAL_EVAL_FILE, resumable.WEIGHTS_FILE):
        path = os.path.join(partial, name)
        if os.path.exists(path):
          os.remove(path)

  _copy_run_into_place(item.source, target, plan.log_path(item.source_dir, item.run),
                       plan.log_path(sweep_dir, item.run), edit=drop_final_outputs,
                       replace_log=False)
  return True


def _copy_run_into_place(source: str, target: str, source_log: str, target_log: str,
                         edit: Callable[[str], None], replace_log: bool,
                         ignore: Optional[Callable] = None) -> None:
  """Copies run directory `source` (and its log) to `target`, replacing it.

  The copy is written under a temporary name, changed by `edit(copy)`, and
  moved into place (`_replace_dir`), so an interrupted copy leaves no half run
  directory (its leftover is removed by the next call). The log is copied
  unless the target has one and not `replace_log`.
  """
  partial = target + _COPYING_SUFFIX
  shutil.rmtree(partial, ignore_errors=True)
  shutil.copytree(source, partial, symlinks=True, ignore=ignore)
  edit(partial)
  if os.path.exists(source_log) and (replace_log or not os.path.exists(target_log)):
    _copy_file(source_log, target_log)
  _replace_dir(partial, target)


# Left out of a bank: what a finished run needs only to train on or to be
# adapted (scripts.adapt), not to be summarized, and the TensorBoard copy of
# metrics.csv.
_NOT_BANKED = (resumable.CHECKPOINTS_DIR, resumable.WEIGHTS_FILE, resumable.TENSORBOARD_DIR)


def _not_banked(directory: str, names: Sequence[str]) -> set:
  """`shutil.copytree`'s ignore: `_NOT_BANKED` and partial writes a kill left."""
  del directory  # the same rule at every level
  return {n for n in names if n in _NOT_BANKED or resumable.is_partial_write(n)}


def check_bank(sweep_dir: str, bank_dir: str, spec: spec_lib.SweepSpec) -> None:
  """`manifest.SweepDirError` unless `bank_dir` can bank `sweep_dir`'s runs of `spec`."""
  if os.path.realpath(bank_dir) == os.path.realpath(sweep_dir):
    raise manifest.SweepDirError(f'--bank_dir={bank_dir} is --sweep_dir itself')
  manifest.check(bank_dir, spec, flag='bank_dir')


def _round(checkpoint: Optional[str]) -> int:
  """The round of a checkpoint name; 0 (the initial state) for none."""
  return resumable.checkpoint_round(checkpoint) if checkpoint else 0


def bank_runs(sweep_dir: str, bank_dir: str, spec: spec_lib.SweepSpec,
              default_total_rounds: int, runs: Sequence[plan.Run],
              checkpoints: bool = False, resume_from: Optional[str] = None,
              final_checkpoints: bool = False) -> list:
  """Copies `runs` of `sweep_dir` into the bank `bank_dir`; the run ids copied.

  A finished run is banked once: its `flags.json`, `metrics.csv` and
  `final_eval.json` (and its log), not its checkpoints, model weights,
  TensorBoard events or partial writes. With `checkpoints`, an unfinished run
  is banked too, with its latest checkpoint only (a few MB; not before it has
  one past round 0, the initial state), and banked again
  when it has a later one or has finished (which replaces it). With
  `final_checkpoints`, a finished run keeps its final checkpoint (the last
  round's state, a few MB), so that a later sweep of more rounds trains it on
  from there, also from a fresh checkout; a run banked finished without it is
  banked again with it. `bank_dir` gets
  this spec's manifest, so it is a sweep directory of the same spec:
  `--resume_from` and `--summary_only --sweep_dir=<bank>` read it. A copy is
  written under a temporary name and then moved into place. Raises
  `manifest.SweepDirError` if `bank_dir` holds another spec's sweep.
  `resume_from`: the sweep's own (if any), recorded in the bank's manifest
  relative to the bank (`plan_copies` follows it).
  """
  check_bank(sweep_dir, bank_dir, spec)
  manifest.write(bank_dir, spec, default_total_rounds, resume_from=resume_from, relative=True)
  banked = []
  for run in runs:
    source, target = plan.run_dir(sweep_dir, run), plan.run_dir(bank_dir, run)
    _restore_replaced(target)
    finished = plan.is_finished(sweep_dir, run)
    final = resumable.latest_checkpoint(source) if final_checkpoints and finished else None
    if plan.is_finished(bank_dir, run) and (
        final is None or resumable.latest_checkpoint(target) is not None):
      continue
    checkpoint = final
    if not finished:
      checkpoint = resumable.latest_checkpoint(source) if checkpoints else None
      in_bank = resumable.latest_checkpoint(target)
      # Banked only past round 0 (the initial state: resuming from it trains
      # every round again) and past the checkpoint already banked.
      if _round(checkpoint) <= _round(in_bank):
        continue

    def add_checkpoint(partial, checkpoint=checkpoint, source=source):
      if checkpoint is not None:
        shutil.copytree(os.path.join(source, resumable.CHECKPOINTS_DIR, checkpoint),
                        os.path.join(partial, resumable.CHECKPOINTS_DIR, checkpoint))

    _copy_run_into_place(source, target, plan.log_path(sweep_dir, run),
                         plan.log_path(bank_dir, run), edit=add_checkpoint, replace_log=True,
                         ignore=_not_banked)
    banked.append(run.run_id)
  return banked


_REPLACED_SUFFIX = '.replaced'


def _replace_dir(new: str, target: str) -> None:
  """Moves directory `new` to `target`, replacing any directory there.

  A kill between the two renames leaves `target` missing and its old copy
  under `_REPLACED_SUFFIX`, which `_restore_replaced` moves back.
  """
  if os.path.exists(target):
    os.rename(target, target + _REPLACED_SUFFIX)
  os.replace(new, target)
  shutil.rmtree(target + _REPLACED_SUFFIX, ignore_errors=True)


def _restore_replaced(target: str) -> None:
  old = target + _REPLACED_SUFFIX
  if os.path.exists(old):
    if os.path.exists(target):
      shutil.rmtree(old)
    else:
      os.rename(old, target)


def copy_if_same_choice(carry: Optional[CarryPlan], sweep_dir: str, run: plan.Run,
                        values: Mapping[str, Any]) -> bool:
  """Copies `run` from the earlier sweep if its search chose what it trained with.

  For the runs of `carry.if_same_choice`, called when the run is about to
  start, with the values its (finished) search chose. The earlier run's
  values are read from its recorded flags (`flags.json`). Returns whether the
  run directory now holds the earlier run (False: train from scratch).
  """
  item = (carry.if_same_choice.get(run.run_id) if carry else None)
  if item is None or os.path.exists(plan.run_dir(sweep_dir, run)):
    return False
  try:
    trained = resumable.read_flags(item.source)
  except (OSError, ValueError):
    return False
  if trained is None or any(k not in trained or trained[k] != v for k, v in values.items()):
    return False
  return _copy_run(item, sweep_dir)


def describe(carry: Optional[CarryPlan]) -> str:
  """One line: how many runs come from the earlier sweep."""
  if carry is None:
    return ''
  resumed = sum(c.resume for c in carry.copies)
  later = len(carry.if_same_choice)
  earlier = (f' (and from {", ".join(carry.earlier_sources)}, which it started from)'
             if carry.earlier_sources else '')
  return (f'--resume_from={carry.source_dir}{earlier}: {len(carry.copies)} run(s) copied '
          f'({resumed} to train to more rounds, {len(carry.copies) - resumed} with the same '
          'rounds; unfinished copies resume from their checkpoints), '
          f'{len(carry.not_copied) - later} not copied'
          + (f', {later} copied if their search chooses as before' if later else ''))
