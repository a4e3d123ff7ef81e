"""Which training flags a run may change when it resumes from its checkpoint.

Kept apart from `loop` (which imports TensorFlow) so that the sweep binary can
read it without starting TensorFlow.
"""

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
