"""Which training flags a run may change when it resumes from its checkpoint.

Kept apart from `loop` (which imports TensorFlow) so that the sweep binary can
read it without starting TensorFlow.
"""

import json
import os
from typing import Optional

# Flags that may change between a run and its resumption without changing
# what is computed (`local_client_parallelism`: up to the float rounding of
# the thread count, which `auto` keeps at one thread per client).
RESUMABLE_FLAG_CHANGES = frozenset(
    {'total_rounds', 'rounds_per_eval', 'rounds_per_checkpoint', 'workers',
     'allow_remote_workers', 'worker_rpc_timeout_s', 'worker_max_clients_per_subround',
     'deterministic', 'client_loop_resolved', 'local_client_parallelism',
     'local_client_parallelism_resolved', 'cpu_path_resolved'})

# The flags.json key naming the CPU path a run started on (recorded, not compared).
CPU_PATH_KEY = 'cpu_path_resolved'

# What a run writes last, once its final round is trained and evaluated; a run
# directory without them resumes from its last checkpoint (`loop`).
FINAL_EVAL_FILE = 'final_eval.json'
WEIGHTS_FILE = 'model_weights.npz'
# A run's flags, written when it starts and checked when it resumes (`loop`).
FLAGS_FILE = 'flags.json'


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
