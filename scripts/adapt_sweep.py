r"""Runs `scripts.adapt` on every finished run of a sweep and summarizes over seeds.

  python -m scripts.adapt_sweep --sweep_dir=outputs/sweeps/adaptation_femnist_models \
      --set=num_participants=30 --set=local_epochs=50 --set=adapt_epochs=5 --parallel=2

For each finished training run `runs/<config>/seed_<s>` of the sweep directory
(`scripts.sweep`), a `scripts.adapt` process (its flags from `--set`) writes
`adaptation/<config>/seed_<s>/` (participants.csv, summary.json); its log goes
to `logs/adaptation/<config>/seed_<s>.log`. The local (from-scratch) models do
not depend on the federated model, so they are trained once per training seed
and data: the first config's run of each seed trains them, the other configs'
runs of that seed reuse its accuracies (`--reuse_local_from`). Rerunning the
same command skips finished adaptations and resumes interrupted ones.

Then `<summary_dir>/adaptation.md` and `adaptation.csv`: per config, mean and
sample standard deviation over seeds of the participants' mean accuracies and of
the shares that the best adaptation helps, leaves unchanged or hurts
(`tff_partial.adaptation.over_seeds`).
"""

import csv
import fnmatch
import glob
import json
import os
import shutil
import sys

from absl import app
from absl import flags

# scripts.adapt: its flags (to check --set names before anything runs) and how
# it reads a run's flags.
from scripts import adapt
from scripts import flag_groups
from tff_partial.adaptation import over_seeds
from tff_partial.sweep import plan
from tff_partial.sweep import runner as runner_lib
from tff_partial.training import atomic

_SWEEP_DIR = flags.DEFINE_string('sweep_dir', None, 'A scripts.sweep directory (runs/<config>/seed_<s>).')
_SET = flags.DEFINE_multi_string(
    'set', [], 'flag=value: a scripts.adapt flag of every adaptation (e.g. num_participants=30).')
_ONLY = flags.DEFINE_list('only', [], 'Adapt only the configs matching these fnmatch patterns.')
_PARALLEL = flags.DEFINE_integer('parallel', 1, 'Adaptations at a time.')
_REUSE_LOCAL = flags.DEFINE_bool(
    'reuse_local', True,
    "Train each seed's local models once (the first config's run) and reuse their "
    'accuracies for the other configs of that seed and data.')
_SUMMARY_ONLY = flags.DEFINE_bool('summary_only', False, 'Summarize finished adaptations; start nothing.')
_SUMMARY_DIR = flags.DEFINE_string('summary_dir', None, 'Default <sweep_dir>/summary.')

_OWN_FLAGS = {h.name for h in (_SWEEP_DIR, _SET, _ONLY, _PARALLEL, _REUSE_LOCAL,
                                _SUMMARY_ONLY, _SUMMARY_DIR)}
ADAPT_DIR = 'adaptation'
_ARGV_FILE = 'adapt_sweep_argv.json'
RUNNING_FILE = 'running_adaptation.json'
# scripts.adapt flags this binary sets per run.
_MANAGED = ('run_dir', 'results_dir', 'reuse_local_from', 'train_if_missing')


class Error(Exception):
  """Bad input; the message is one line naming the flag."""


def parse_set(items) -> dict:
  """--set flag=value items -> {flag: value} (scripts.adapt's flags only)."""
  out = {}
  for item in items:
    name, sep, value = item.partition('=')
    name = name.strip().lstrip('-')
    if not sep or not name:
      raise Error(f'--set={item!r}: expected flag=value')
    if name in _MANAGED:
      raise Error(f'--set={item!r}: scripts.adapt_sweep sets --{name} itself')
    if name not in flags.FLAGS or name in _OWN_FLAGS:
      raise Error(f'--set={item!r}: scripts.adapt has no flag --{name}')
    out[name] = value
  return out


def finished_runs(sweep_dir: str, only=()) -> list:
  """plan.Run-like records of the sweep's finished training runs, sorted."""
  found = []
  for path in sorted(glob.glob(os.path.join(sweep_dir, plan.RUNS_DIR, '*', 'seed_*',
                                            plan.FINISHED_FILE))):
    run_dir = os.path.dirname(path)
    config = os.path.basename(os.path.dirname(run_dir))
    if only and not any(fnmatch.fnmatchcase(config, p) for p in only):
      continue
    saved = adapt.load_run_flags(run_dir)
    found.append((config, int(saved.get('seed', 0)), run_dir, saved))
  return sorted(found, key=lambda r: (r[1], r[0]))


def data_key(saved: dict) -> str:
  """What a run's clients' data depends on: its task and data flags and its seed."""
  return json.dumps(dict(adapt.data_flags(saved), seed=saved.get('seed')), sort_keys=True)


def results_dir(sweep_dir: str, config: str, seed: int) -> str:
  return os.path.join(sweep_dir, ADAPT_DIR, config, f'seed_{seed}')


def plan_adaptations(sweep_dir: str, runs, adapt_flags: dict, reuse_local: bool) -> tuple:
  """(plan.Runs, run id -> argv, run id -> dependencies)."""
  leaders = {}
  jobs, argvs, deps = [], {}, {}
  # A run already adapted as its data's leader (it trained the local models)
  # stays the leader, so that runs finishing later (e.g. an earlier config of
  # the same seed) do not change its argv and force its adaptation again.
  runs = sorted(runs, key=lambda r: not _adapted_as_leader(
      results_dir(sweep_dir, r[0], r[1])))
  for config, seed, run_dir, saved in runs:
    out = results_dir(sweep_dir, config, seed)
    run_id = os.path.relpath(out, sweep_dir)
    argv = [sys.executable, '-m', 'scripts.adapt', f'--run_dir={run_dir}',
            f'--results_dir={out}'] + [f'--{k}={v}' for k, v in sorted(adapt_flags.items())]
    key = data_key(saved)
    if reuse_local and key in leaders:
      leader_id, leader_out = leaders[key]
      argv.append(f'--reuse_local_from={os.path.join(leader_out, "participants.csv")}')
      deps[run_id] = [leader_id]
    else:
      leaders[key] = (run_id, out)
      deps[run_id] = []
    jobs.append(plan.Run(run_id=run_id, config=config, seed=seed, flags={}, total_rounds=0))
    argvs[run_id] = argv
  return jobs, argvs, deps


def _saved(out: str) -> tuple:
  """(the argv this binary started `out`'s adaptation with or None, finished?)."""
  argv_path = os.path.join(out, _ARGV_FILE)
  if not os.path.exists(argv_path):
    return None, False
  with open(argv_path) as f:
    return json.load(f), os.path.exists(os.path.join(out, 'summary.json'))


def _adapted_as_leader(out: str) -> bool:
  saved, finished = _saved(out)
  return finished and not any(a.startswith('--reuse_local_from=') for a in saved)


def stale_partial(out: str, argv) -> bool:
  """`out` holds an unfinished adaptation of this binary with another argv."""
  saved, finished = _saved(out)
  return saved is not None and not finished and saved != argv[1:]


def is_adapted(sweep_dir: str, run: plan.Run, argv) -> bool:
  saved, finished = _saved(os.path.join(sweep_dir, run.run_id))
  return finished and saved == argv[1:]


def read_summaries(sweep_dir: str, jobs) -> dict:
  """config -> the adaptation summaries of its seeds (finished ones)."""
  by_config = {}
  for run in jobs:
    path = os.path.join(sweep_dir, run.run_id, 'summary.json')
    if os.path.exists(path):
      with open(path) as f:
        by_config.setdefault(run.config, []).append(json.load(f))
  return by_config


def write_summary(out_dir: str, by_config: dict) -> str:
  """adaptation.csv and adaptation.md in out_dir; returns the .md path."""
  os.makedirs(out_dir, exist_ok=True)
  rows = over_seeds.rows(by_config)
  with atomic.atomic_write(os.path.join(out_dir, 'adaptation.csv'), newline='') as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  table = over_seeds.markdown(by_config)
  path = os.path.join(out_dir, 'adaptation.md')
  with atomic.atomic_write(path) as f:
    f.write('# Local adaptation over training seeds\n\n'
            'Per config: mean ± sample std over seeds (each seed one `scripts.adapt` run); '
            'accuracies and shares of participants in %.\n\n' + table + '\n')
  return path


def main(argv):
  if len(argv) > 1:
    print(f'error: unexpected arguments: {" ".join(argv[1:])}', file=sys.stderr)
    sys.exit(2)
  try:
    sweep_dir = _SWEEP_DIR.value
    if not sweep_dir or not os.path.isdir(os.path.join(sweep_dir, plan.RUNS_DIR)):
      raise Error(f'--sweep_dir={sweep_dir!r} is not a scripts.sweep directory (no runs/)')
    if _PARALLEL.value < 1:
      raise Error(f'--parallel={_PARALLEL.value} must be >= 1')
    adapt_flags = parse_set(_SET.value)
    runs = finished_runs(sweep_dir, _ONLY.value)
    if not runs:
      raise Error(f'--sweep_dir={sweep_dir!r} has no finished runs'
                  + (f' matching --only={",".join(_ONLY.value)}' if _ONLY.value else ''))
    jobs, argvs, deps = plan_adaptations(sweep_dir, runs, adapt_flags, _REUSE_LOCAL.value)
  except (Error, flag_groups.FlagError) as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  failed = []
  if not _SUMMARY_ONLY.value:
    def command(run):
      out = os.path.join(sweep_dir, run.run_id)
      if stale_partial(out, argvs[run.run_id]):
        # An unfinished adaptation of this sweep with other arguments (e.g.
        # it was its data's leader then): scripts.adapt would refuse to resume
        # it, and it has no results to keep.
        shutil.rmtree(out)
      os.makedirs(out, exist_ok=True)
      with atomic.atomic_write(os.path.join(out, _ARGV_FILE)) as f:
        json.dump(argvs[run.run_id][1:], f, indent=1)
      return argvs[run.run_id]

    runner = runner_lib.Runner(
        sweep_dir, jobs, command, parallel=_PARALLEL.value, name='adaptation',
        is_finished=lambda d, r: is_adapted(d, r, argvs[r.run_id]), dependencies=deps,
        running_file=RUNNING_FILE)  # not the training sweep's running.json beside it
    try:
      report = runner.run()
    except runner_lib.SweepInterrupted as e:
      print(f'adaptation: {e}; rerun the same command to resume.', file=sys.stderr)
      sys.exit(128 + e.signum)
    failed = report.ids('failed', 'skipped')
    for run_id in failed:
      print(f'{run_id}: {report.reasons.get(run_id, "")}', file=sys.stderr)
  by_config = read_summaries(sweep_dir, jobs)
  if by_config:
    path = write_summary(_SUMMARY_DIR.value or os.path.join(sweep_dir, plan.SUMMARY_DIR),
                         by_config)
    print(over_seeds.markdown(by_config))
    print(f'summary: {path}')
  if failed:
    sys.exit(1)


if __name__ == '__main__':
  app.run(main)
