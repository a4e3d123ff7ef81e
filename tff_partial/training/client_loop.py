"""How a client iterates its dataset: TFF's two loops, and `auto` choosing one.

TFF's learning builders take `loop_implementation`:
`DATASET_REDUCE` (`dataset.reduce`, TFF's default: the step function runs
inside tf.data's function runtime) or `DATASET_ITERATOR` (a loop over the
dataset's iterator in the training graph). Both take the same steps in the
same order; which one is faster depends on the model and on TensorFlow's CPU
path (oneDNN on or off, AVX-512 or not), so `auto` picks, per task and CPU
path, the loop that `scripts.benchmark` measured faster (`MEASURED_FASTER`;
measure a row with `--benchmark_configs=tff_fedavg,tff_fedavg_iterator` per
task under `TF_ENABLE_ONEDNN_OPTS=0` and `=1`), and TFF's default where
nothing was measured, so that `auto` is never slower than TFF's default by
measurement.

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

# (task, worker oneDNN on, CPU has AVX-512) -> the loop measured faster.
# Measured 2026-11-23 on a 2-core AMD EPYC (Zen 5, AVX-512), TFF FedAvg with
# each loop interleaved round by round in one scripts.benchmark run per task
# and path (docs/benchmarks.md "Client loop by measurement";
# docs/benchmark_results/client_loop/): the iterator loop used 11-55% fewer
# CPU seconds per round for every task on both paths (median of per-round
# ratios 0.45-0.89), and its wall time was lower or within the noise of the
# shared machine (load 10-25). No CPU without AVX-512 was measured: there
# `auto` keeps TFF's default (a no-AVX-512 AMD machine measured the iterator
# loop slower on emnist_cnn_gn: 2.53 vs 2.01 s/round, issue 17).
_TASKS_MEASURED = ('emnist_cnn_gn', 'emnist_cnn', 'emnist_2nn', 'cifar10_resnet18',
                   'stackoverflow_nwp', 'stackoverflow_tags', 'shakespeare_char',
                   'shakespeare_word')
MEASURED_FASTER: dict[tuple[str, bool, bool], str] = {
    (task, onednn, True): ITERATOR
    for task in _TASKS_MEASURED for onednn in (False, True)}


def worker_onednn() -> bool:
  """Whether TFF's worker runs oneDNN kernels: TF_ENABLE_ONEDNN_OPTS, else on."""
  value = os.environ.get('TF_ENABLE_ONEDNN_OPTS')
  if value is None:
    return True
  return value.strip().lower() in ('1', 'true', 'yes', 'on')


def cpu_flags() -> set:
  """The CPU's feature flags (/proc/cpuinfo; empty where there is none)."""
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        key, _, value = line.partition(':')
        if key.strip() == 'flags':
          return set(value.split())
  except OSError:
    pass
  return set()


def cpu_has_avx512() -> bool:
  return 'avx512f' in cpu_flags()


def resolve(choice: str, task_name: str, onednn: Optional[bool] = None,
            avx512: Optional[bool] = None) -> str:
  """`iterator` or `reduce` for `choice` (`auto` looks the task up)."""
  if choice not in CHOICES:
    raise ValueError(f'--client_loop={choice!r}; valid values: {", ".join(CHOICES)}')
  if choice != AUTO:
    return choice
  if onednn is None:
    onednn = worker_onednn()
  if avx512 is None:
    avx512 = cpu_has_avx512()
  return MEASURED_FASTER.get((task_name, onednn, avx512), REDUCE)


def loop_implementation(choice: str, task_name: str) -> tff.learning.LoopImplementation:
  """The `tff.learning.LoopImplementation` of `resolve(choice, task_name)`."""
  return _LOOPS[resolve(choice, task_name)]
