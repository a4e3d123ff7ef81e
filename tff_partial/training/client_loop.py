"""How a client iterates its dataset: TFF's two loops, and `auto` choosing one.

TFF's learning builders take `loop_implementation`:
`DATASET_REDUCE` (`dataset.reduce`, TFF's default: the step function runs
inside tf.data's function runtime) or `DATASET_ITERATOR` (a loop over the
dataset's iterator in the training graph). Both take the same steps in the
same order; which one is faster depends on the model and on TensorFlow's CPU
path (oneDNN on or off, AVX-512 or not), so `auto` picks, per task and CPU
path, the loop that `scripts.benchmark` measured faster (`MEASURED_FASTER`;
measure a CPU with `docs/benchmark_results/client_loop_no_avx512/run.sh`,
which runs this package's FedAvg with each loop beside TFF's default FedAvg
for every task under `TF_ENABLE_ONEDNN_OPTS=0` and `=1`), and TFF's default
where nothing was measured.

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

# (task, worker oneDNN on, CPU has AVX-512) -> the loop measured faster. The
# rule: the loop with fewer CPU seconds per round, unless its wall time per
# round is more than 5% higher (a sweep runs one process per core, where CPU
# seconds are what limits it).
#
# Both CPU kinds measured the same way (this package's FedAvg with each loop
# and TFF's default FedAvg interleaved round by round in one scripts.benchmark
# run per task and path, 10 clients, 6 timed rounds, quiet 2-core machine;
# docs/benchmarks.md "Client loop by measurement"), and both give the same
# choice: the iterator loop for every task but the Stack Overflow transformer,
# which is faster with dataset.reduce. Median per-round ratio iterator /
# reduce, wall (CPU), oneDNN off; on:
#
# AVX-512: 2026-11-25, Intel Xeon (AVX-512 with VNNI, BF16 and FP16),
# docs/benchmark_results/client_loop_avx512_intel/: cifar10_resnet18 0.61
# (0.57); 0.53 (0.45), emnist_2nn 0.69 (0.57); 0.67 (0.58), emnist_cnn 1.00
# (0.93); 0.73 (0.72), emnist_cnn_gn 0.80 (0.88); 0.73 (0.70),
# shakespeare_char 0.86 (0.77); 0.78 (0.71), shakespeare_word 0.93 (0.79);
# 0.96 (0.84), stackoverflow_tags 0.99 (0.94); 0.91 (0.90), and
# stackoverflow_nwp 1.17 (1.11); 1.18 (1.24). (These rows replace ones from
# 2026-11-23 on a loaded AMD Zen 5, iterator for every task, whose files were
# never committed; the transformer was not faster with the iterator here.)
#
# No AVX-512: 2026-11-25, AMD EPYC (Zen 3),
# docs/benchmark_results/client_loop_no_avx512/: cifar10_resnet18 0.55
# (0.56); 0.58 (0.50), emnist_2nn 0.65 (0.61); 0.74 (0.60), emnist_cnn 0.96
# (0.93); 0.84 (0.76), emnist_cnn_gn 1.03 (0.88); 0.84 (0.76),
# shakespeare_char 0.92 (0.85); 0.92 (0.81), shakespeare_word 0.96 (0.87);
# 0.88 (0.81), stackoverflow_tags 0.95 (0.90); 0.86 (0.85), and
# stackoverflow_nwp 1.18 (1.15); 1.36 (1.44).
_TASKS_MEASURED = ('emnist_cnn_gn', 'emnist_cnn', 'emnist_2nn', 'cifar10_resnet18',
                   'stackoverflow_nwp', 'stackoverflow_tags', 'shakespeare_char',
                   'shakespeare_word')
MEASURED_FASTER: dict[tuple[str, bool, bool], str] = {
    (task, onednn, avx512): (REDUCE if task == 'stackoverflow_nwp' else ITERATOR)
    for task in _TASKS_MEASURED for onednn in (False, True) for avx512 in (False, True)}


def worker_onednn() -> bool:
  """Whether TFF's worker runs oneDNN kernels: TF_ENABLE_ONEDNN_OPTS, else on."""
  value = os.environ.get('TF_ENABLE_ONEDNN_OPTS')
  if value is None:
    return True
  return value.strip().lower() in ('1', 'true', 'yes', 'on')


def cpuinfo_fields() -> dict:
  """The first processor's block of /proc/cpuinfo, key -> value (empty where there is none)."""
  fields = {}
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if not line.strip():
          break  # the first processor's block is enough
        key, _, value = line.partition(':')
        fields.setdefault(key.strip(), value.strip())
  except OSError:
    pass
  return fields


def cpu_flags() -> set:
  """The CPU's feature flags (/proc/cpuinfo; empty where there is none)."""
  return set(cpuinfo_fields().get('flags', '').split())


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
