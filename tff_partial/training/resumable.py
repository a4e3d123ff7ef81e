"""Which training flags a run may change when it resumes from its checkpoint.

Kept apart from `loop` (which imports TensorFlow) so that the sweep binary can
read it without starting TensorFlow.
"""

import json
import os
import re
import shutil
from typing import Optional

from tff_partial.training import atomic

# Flags that may change between a run and its resumption without changing
# what is computed (`local_client_parallelism`: up to the float rounding of
# the thread count, which `auto` keeps at one thread per client).
RESUMABLE_FLAG_CHANGES = frozenset(
    {'total_rounds', 'rounds_per_eval', 'rounds_per_checkpoint', 'workers',
     'allow_remote_workers', 'worker_rpc_timeout_s', 'worker_max_clients_per_subround',
     'deterministic', 'client_loop_resolved', 'local_client_parallelism',
     'local_client_parallelism_resolved', 'cpu_path_resolved',
     'local_worker_restart_mb'})

# The flags.json key naming the CPU path a run started on (recorded, not compared).
CPU_PATH_KEY = 'cpu_path_resolved'

# What a run writes last, once its final round is trained and evaluated; a run
# directory without them resumes from its last checkpoint (`loop`).
FINAL_EVAL_FILE = 'final_eval.json'
# Each round's metrics, one row a round (a round retrained after a resume: again).
METRICS_FILE = 'metrics.csv'
WEIGHTS_FILE = 'model_weights.npz'
# A run's flags, written when it starts and checked when it resumes (`loop`).
FLAGS_FILE = 'flags.json'
CHECKPOINTS_DIR = 'checkpoints'
# The same metrics as metrics.csv, for TensorBoard (`loop`).
TENSORBOARD_DIR = 'tensorboard'

# TFF's file managers write `<path>_temp<4 digits>` and rename it over `<path>`
# (`tff.program.CSVFileReleaseManager` for metrics.csv, a file;
# `FileProgramStateManager` for each checkpoint, a directory). A run killed
# mid-write leaves that partial copy behind; TFF never reads or removes it.
# `atomic.TEMP_NAME` is what this package's own writes leave when killed.
_TEMP_SUFFIX = re.compile(r'_temp[0-9]{4}$')


def read_flags(run_dir: str) -> Optional[dict]:
  """The flags a run recorded in its `flags.json`; None if it has none.

  The one reader of the file for the loop (resume check), the sweep (summary,
  carry) and the report binaries (`scripts.adapt`, `scripts.pvt_coverage`).
  Raises ValueError naming the file if it is not a JSON object.
  """
  path = os.path.join(run_dir, FLAGS_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    try:
      saved = json.load(f)
    except ValueError as e:
      raise ValueError(f'{path} is not valid JSON: {e}') from e
  if not isinstance(saved, dict):
    raise ValueError(f'{path} is not a JSON object of flags')
  return saved


def is_partial_write(name: str) -> bool:
  """Whether a file name is that of a partial write (TFF's or `atomic.atomic_write`'s)."""
  return bool(_TEMP_SUFFIX.search(name) or atomic.TEMP_NAME.search(name))


# `tff.program.FileProgramStateManager`'s checkpoint names (its default prefix).
_CHECKPOINT_NAME = re.compile(r'^program_state_([0-9]+)$')


def checkpoint_round(name: str) -> Optional[int]:
  """The round of a checkpoint named by TFF (`program_state_<round>`); None for another name."""
  match = _CHECKPOINT_NAME.match(name)
  return int(match.group(1)) if match else None


def latest_checkpoint(run_dir: str) -> Optional[str]:
  """The name of the run's latest complete checkpoint in `CHECKPOINTS_DIR`; None if none.

  Read from the names alone, without TensorFlow, for the sweep binary (TFF
  renames a checkpoint into place once written, so a name that matches is
  complete; `FileProgramStateManager.get_versions` needs an event loop).
  """
  directory = os.path.join(run_dir, CHECKPOINTS_DIR)
  if not os.path.isdir(directory):
    return None
  rounds = {checkpoint_round(name): name for name in os.listdir(directory)}
  rounds.pop(None, None)
  return rounds[max(rounds)] if rounds else None


def remove_stale_temp_files(run_dir: str) -> list:
  """Removes the partial writes a killed run left in `run_dir`; their paths, sorted.

  Looks only at `run_dir` itself and its checkpoints directory, for names that
  end in `_temp` and 4 digits (TFF's, see `_TEMP_SUFFIX`) or in `.<pid>.<8
  hex>.tmp` (this package's `atomic.atomic_write`). For a run directory no
  other process writes to: the loop calls it when it starts or resumes a run.
  """
  removed = []
  for directory in (run_dir, os.path.join(run_dir, CHECKPOINTS_DIR)):
    if not os.path.isdir(directory):
      continue
    for name in os.listdir(directory):
      if not is_partial_write(name):
        continue
      path = os.path.join(directory, name)
      if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
      else:
        os.remove(path)
      removed.append(path)
  return sorted(removed)
