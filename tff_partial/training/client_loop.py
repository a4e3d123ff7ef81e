"""How a client iterates its dataset: TFF's two loops, and `auto` choosing one.

TFF's learning builders take `loop_implementation`:
`DATASET_REDUCE` (`dataset.reduce`, TFF's default: the step function runs
inside tf.data's function runtime) or `DATASET_ITERATOR` (a loop over the
dataset's iterator in the training graph). Both take the same steps in the
same order; which one is faster depends on the model and on TensorFlow's CPU
path (oneDNN on or off), so `auto` picks, per task and CPU path, the loop
that `scripts.benchmark` measured faster (`MEASURED_FASTER`; regenerate it
with `--benchmark_configs=tff_fedavg,tff_fedavg_iterator` per task under
`TF_ENABLE_ONEDNN_OPTS=0` and `=1`), and TFF's default for a task it has not
measured, so that `auto` is never slower than TFF's default by measurement.

The CPU path that matters is the one of TFF's worker, where clients train:
`TF_ENABLE_ONEDNN_OPTS` when set, else on (the worker binary of TFF 0.87
enables oneDNN by default on x86, whatever the CPU; see
`tff_partial.bench.machine`).
"""

import os
from typing import Optional

import tensorflow_federated as tff

REDUCE = 'reduce'
ITERATOR = 'iterator'
AUTO = 'auto'
CHOICES = (AUTO, ITERATOR, REDUCE)

_LOOPS = {
    ITERATOR: tff.learning.LoopImplementation.DATASET_ITERATOR,
    REDUCE: tff.learning.LoopImplementation.DATASET_REDUCE,
}

# (task, worker oneDNN on) -> the loop measured faster (median CPU and wall
# seconds per round, TFF FedAvg with each loop interleaved in one
# scripts.benchmark run; docs/benchmarks.md "Client loop by measurement").
MEASURED_FASTER: dict[tuple[str, bool], str] = {}


def worker_onednn() -> bool:
  """Whether TFF's worker runs oneDNN kernels: TF_ENABLE_ONEDNN_OPTS, else on."""
  value = os.environ.get('TF_ENABLE_ONEDNN_OPTS')
  if value is None:
    return True
  return value.strip().lower() in ('1', 'true', 'yes', 'on')


def resolve(choice: str, task_name: str, onednn: Optional[bool] = None) -> str:
  """`iterator` or `reduce` for `choice` (`auto` looks the task up)."""
  if choice not in CHOICES:
    raise ValueError(f'--client_loop={choice!r}; valid values: {", ".join(CHOICES)}')
  if choice != AUTO:
    return choice
  if onednn is None:
    onednn = worker_onednn()
  return MEASURED_FASTER.get((task_name, onednn), REDUCE)


def loop_implementation(choice: str, task_name: str,
                        onednn: Optional[bool] = None) -> tff.learning.LoopImplementation:
  """The `tff.learning.LoopImplementation` of `resolve(choice, task_name)`."""
  return _LOOPS[resolve(choice, task_name, onednn)]
