r"""Runs a seeded sweep of `scripts.train` runs: grid x seeds, learning-rate search, summary.

  python -m scripts.sweep --spec=experiments/sweeps/fedpt_table1.json --parallel=2

  python -m scripts.sweep --sweep_dir=outputs/sweeps/lr \
      --set=task=emnist_2nn --set=data_source=synthetic --set=total_rounds=5 \
      --grid=client_learning_rate=0.03,0.1 --grid=clients_per_round=1,2 --seeds=0,1

Every (config, seed) is a `scripts.train` run in its own directory under
--sweep_dir, --parallel at a time. Rerunning the same command skips finished
runs and resumes unfinished ones from their checkpoints. Bad input (a flag
scripts.train does not have, another method's flags, a sweep directory of
another spec) stops with one line before anything runs. --resume_from=<earlier
sweep dir> starts from an earlier sweep's runs where only --total_rounds (or
another flag a resumed run may change) differs, e.g. to run a finished sweep on
to more rounds:

  python -m scripts.sweep --spec=experiments/sweeps/select_fig6_femnist_cnn_800.json \
      --resume_from=outputs/sweeps/select_fig6_femnist_cnn --parallel=2

--search_only runs only the learning-rate searches and prints each choice (and
a warning if one sits at its grid's edge), so a grid can be widened before the
full runs are paid for; the same command without it goes on from there.

A sweep longer than one session on a machine whose outputs/ does not survive:
--bank_dir=experiments/banked/<name> copies each finished run there (no
checkpoints or weights; commit it), --bank_checkpoints also each unfinished
run's latest checkpoint when the sweep ends or is stopped, and in a fresh
checkout --resume_from=experiments/banked/<name> takes them back: finished
runs are not trained again, banked unfinished ones resume from their checkpoint.
--bank_final_checkpoints keeps each finished run's final checkpoint in the bank
too, so that a later sweep of more rounds can resume from the bank and train
those runs on rather than from scratch.

The spec format, the learning-rate search and the summary's definitions:
docs/sweeps.md and `tff_partial.sweep`.
"""

import json
import os
import subprocess
import sys

from absl import app
from absl import flags

from tff_partial import sweep
from tff_partial.sweep import carry
from tff_partial.sweep import plan

_SPEC = flags.DEFINE_string('spec', None, 'Sweep spec, a JSON file (docs/sweeps.md).')
_SWEEP_DIR = flags.DEFINE_string(
    'sweep_dir', None, 'Where the runs and the summary go (default outputs/sweeps/<name>).')
_NAME = flags.DEFINE_string('name', None, 'Sweep name (overrides the spec\'s "name").')
_SET = flags.DEFINE_multi_string(
    'set', [], 'flag=value: a scripts.train flag of every run (added to the spec\'s "base").')
_GRID = flags.DEFINE_multi_string(
    'grid', [], 'flag=v1,v2,...: a grid dimension (crossed with the spec\'s "grid"; '
    'list-valued flags need a spec file).')
_SEEDS = flags.DEFINE_list('seeds', None, 'Seeds of every config (overrides "seeds").')
_LR_GRID = flags.DEFINE_multi_string(
    'lr_grid', [], 'flag=v1,v2,...: a dimension of the learning-rate search on the '
    'validation split (e.g. client_learning_rate=0.01,0.03,0.1).')
_ONLY = flags.DEFINE_list(
    'only', [], 'Run (and summarize) only the configs whose names match one of these '
    'fnmatch patterns, e.g. "fedavg,select_conv2+select_keys=1*", with the searches they '
    'need; the sweep directory stays the whole spec\'s.')
_RESUME_FROM = flags.DEFINE_string(
    'resume_from', None, 'An earlier sweep\'s --sweep_dir: each run of this sweep that it '
    'has with the same flags up to --total_rounds (and the other flags a resumed run may '
    'change) is copied from there and trains on from its last checkpoint, e.g. a finished '
    '400-round sweep run on to 1,500 rounds by a spec that "extends" it. The sweep '
    'records it: a rerun without it (after a stop) starts from the same directory.')
_SEARCH_HISTORY = flags.DEFINE_list(
    'search_history', [], 'Earlier sweeps\' --sweep_dirs (or banks), e.g. the specs of a '
    'chain that widened a grid past its edge: the search tables also show, in italics, the '
    'trials they ran outside this sweep\'s grid with the same flags but the searched ones. '
    'Nothing is copied from them and the choice stays this grid\'s.')
_BANK_DIR = flags.DEFINE_string(
    'bank_dir', None, 'Copy every finished run (flags.json, metrics.csv, final_eval.json, its '
    'log; not its checkpoints, weights or TensorBoard events) with the manifest into this '
    'directory, small enough to commit: the runs finished before at the start (with '
    '--summary_only: and start nothing), the others as each finishes. In a fresh checkout, '
    '--resume_from=<bank_dir> takes them back and only the unfinished runs train (from '
    'scratch, or from a checkpoint banked by --bank_checkpoints).')
_BANK_CHECKPOINTS = flags.DEFINE_bool(
    'bank_checkpoints', False, 'With --bank_dir: bank the unfinished runs too, each with its '
    'latest checkpoint past round 0 (a few MB a run), when the sweep ends or is stopped (with '
    '--summary_only: now), so that a fresh checkout resumes them from there rather than from '
    'scratch. Commit such a bank only while the sweep is unfinished.')
_BANK_FINAL_CHECKPOINTS = flags.DEFINE_bool(
    'bank_final_checkpoints', False, 'With --bank_dir: bank each finished run with its final '
    'checkpoint too (the last round\'s state, a few MB a run; a run banked before without it '
    'is banked again), so that a later sweep of more rounds (--resume_from=<bank_dir>) trains '
    'it on from there rather than from scratch, also in a fresh checkout.')
_PARALLEL = flags.DEFINE_integer('parallel', 1, 'Runs at a time.')
_WORKERS = flags.DEFINE_list(
    'workers', [], 'Running TFF workers (host:port), shared out among the --parallel runs '
    '(each gets every --parallel-th one as its --workers).')
_DRY_RUN = flags.DEFINE_bool(
    'dry_run', False, 'Check everything and print the runs; run and write nothing.')
_SUMMARY_ONLY = flags.DEFINE_bool(
    'summary_only', False, 'Write the summary of the finished runs; start nothing.')
_SEARCH_ONLY = flags.DEFINE_bool(
    'search_only', False,
    'Run only the learning-rate searches, print each choice and any grid-edge warning, and '
    'stop; the full runs start when the same command runs without it.')
_SUMMARY_DIR = flags.DEFINE_string(
    'summary_dir', None, 'Where the tables and plots go (default <sweep_dir>/summary).')

_TRAIN_MODULE = 'scripts.train'


def _fail(message: str) -> None:
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def check_train_argvs(argvs) -> tuple:
  """(errors, --total_rounds default) from scripts.sweep_check, run in a subprocess.

  A subprocess, because it imports scripts.train, whose flags would clash
  with this binary's.
  """
  print(f'checking {len(argvs)} training command line(s) with scripts.train\'s flag checks ...',
        flush=True)
  request = json.dumps({'argvs': argvs})
  result = subprocess.run(
      [sys.executable, '-m', 'scripts.sweep_check'], input=request, capture_output=True,
      text=True, check=False)
  if result.returncode != 0:
    tail = result.stderr.strip().splitlines()[-1:] or ['no output']
    raise sweep.CheckError(f'scripts.sweep_check failed: {tail[0]}')
  answer = json.loads(result.stdout.strip().splitlines()[-1])
  return answer['errors'], answer['total_rounds_default']


def train_interface() -> sweep.TrainInterface:
  return sweep.TrainInterface(
      command=[sys.executable, '-m', _TRAIN_MODULE], check_fn=check_train_argvs)


def _print_plan(prepared, runs) -> None:
  print(f'sweep {prepared.spec.name} (spec digest {prepared.spec.digest()}) in '
        f'{prepared.sweep_dir}: {len(prepared.configs)} configs, {len(runs)} runs, '
        f'{sum(r.total_rounds for r in runs)} rounds')
  copies = {c.run.run_id: c for c in prepared.carry.copies} if prepared.carry else {}
  if prepared.carry_note:
    print(prepared.carry_note)
  if prepared.carry:
    print(carry.describe(prepared.carry))
  for run in runs:
    state = 'finished' if plan.is_finished(prepared.sweep_dir, run) else 'to run'
    if (state == 'to run' and run.run_id in copies
        and not os.path.exists(plan.run_dir(prepared.sweep_dir, run))):
      copy = copies[run.run_id]
      state = f'copied from {copy.source}' + (', then trains on' if copy.resume else '')
    elif (state == 'to run' and prepared.carry
          and run.run_id in prepared.carry.if_same_choice):
      state = (f'copied from {prepared.carry.if_same_choice[run.run_id].source} if its '
               'search chooses the values it trained with, else to run')
    elif state == 'to run' and prepared.carry and run.run_id in prepared.carry.not_copied:
      state += f' (not copied: {prepared.carry.not_copied[run.run_id]})'
    tuned = f' (searched values from {run.tuned_by})' if run.tuned_by else ''
    print(f'  {run.run_id}: {run.total_rounds} rounds, {state}{tuned}')


def main(argv):
  if len(argv) > 1:
    _fail(f'unexpected arguments: {" ".join(argv[1:])}')
  for name, flag in (('bank_checkpoints', _BANK_CHECKPOINTS),
                     ('bank_final_checkpoints', _BANK_FINAL_CHECKPOINTS)):
    if flag.value and _BANK_DIR.value is None:
      _fail(f'--{name} needs --bank_dir (where to bank them)')
  if _SUMMARY_ONLY.value and _RESUME_FROM.value:
    # --summary_only starts nothing and so copies nothing: its summary of an empty sweep
    # directory would be rows of nan.
    _fail(f'--summary_only copies nothing from --resume_from={_RESUME_FROM.value}: drop '
          '--summary_only to copy its finished runs and write the summary (nothing trains '
          'when all are finished), or summarize it in place with --summary_only '
          f'--sweep_dir={_RESUME_FROM.value}')
  if _PARALLEL.value < 1:
    _fail(f'--parallel={_PARALLEL.value} must be >= 1')
  if _WORKERS.value and len(_WORKERS.value) < _PARALLEL.value:
    _fail(f'--workers lists {len(_WORKERS.value)} worker(s); --parallel={_PARALLEL.value} '
          'needs at least one for each parallel run')
  try:
    seeds = [int(s) for s in _SEEDS.value] if _SEEDS.value else None
  except ValueError:
    _fail(f'--seeds={",".join(_SEEDS.value)} must be integers')
  train = train_interface()
  try:
    data = sweep.load_spec(_SPEC.value) if _SPEC.value else {}
    data = sweep.merge_overrides(data, name=_NAME.value, set_flags=_SET.value,
                                 grid=_GRID.value, seeds=seeds, lr_grid=_LR_GRID.value)
    spec = sweep.from_dict(data)
    sweep_dir = _SWEEP_DIR.value or os.path.join('outputs', 'sweeps', spec.name)
    prepared = sweep.prepare(spec, sweep_dir, train, only=_ONLY.value,
                             resume_from=_RESUME_FROM.value,
                             search_history=_SEARCH_HISTORY.value)
    runs = sweep.search_runs(prepared) if _SEARCH_ONLY.value else prepared.runs
    if _BANK_DIR.value is not None:
      sweep.check_bank(prepared, _BANK_DIR.value)
  except (sweep.SpecError, sweep.SweepDirError, sweep.CheckError) as e:
    _fail(str(e))
  except KeyboardInterrupt:
    print('interrupted before any run started', file=sys.stderr)
    sys.exit(130)
  if _DRY_RUN.value:
    _print_plan(prepared, runs)
    return
  if _SUMMARY_ONLY.value:
    if _BANK_DIR.value is not None:
      banked = sweep.bank(prepared, _BANK_DIR.value, checkpoints=_BANK_CHECKPOINTS.value,
                          final_checkpoints=_BANK_FINAL_CHECKPOINTS.value)
      print(f'--bank_dir={_BANK_DIR.value}: {len(banked)} run(s) banked now')
    paths = sweep.summarize(prepared, summary_dir=_SUMMARY_DIR.value)
  else:
    try:
      report, paths = sweep.run(prepared, train, parallel=_PARALLEL.value,
                                workers=_WORKERS.value, summary_dir=_SUMMARY_DIR.value,
                                search_only=_SEARCH_ONLY.value, bank_dir=_BANK_DIR.value,
                                bank_checkpoints=_BANK_CHECKPOINTS.value,
                                bank_final_checkpoints=_BANK_FINAL_CHECKPOINTS.value)
    except sweep.SweepInterrupted as e:
      print(f'sweep {spec.name}: {e}; the running runs were stopped. Rerun the same command '
            'to resume.', file=sys.stderr)
      sys.exit(128 + e.signum)
    except sweep.SweepDirError as e:
      _fail(str(e))
  print(f'summary: {paths["summary"]}')
  if not _SUMMARY_ONLY.value and report.ids('failed', 'skipped'):
    sys.exit(1)


if __name__ == '__main__':
  app.run(main)
