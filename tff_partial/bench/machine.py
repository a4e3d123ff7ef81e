"""What a benchmark ran on: CPU, AVX-512, oneDNN, load; CPU seconds used.

TensorFlow's oneDNN path changes which kernels run, so every report names it
for both processes that compute: this Python process (centralized Keras, the
tf.function floor) and TFF's C++ `worker_binary` (where clients train). They
can differ: TF 2.14's Python wheel turns oneDNN on by default only on CPUs
with AVX-512 (VNNI/BF16), while the worker binary shipped with TFF 0.87 turns
it on unless `TF_ENABLE_ONEDNN_OPTS=0` (measured: it logs "oneDNN custom
operations are on" on a CPU without AVX-512 too). Set `TF_ENABLE_ONEDNN_OPTS`
to 0 or 1 to put both on the same path.
"""

import dataclasses
import os
import platform
from typing import Optional

import psutil

from tff_partial.training import client_loop


def cpu_model() -> str:
  """The CPU's model name, with its x86 family and model numbers where known.

  Cloud machines may name Zen 3, 4 and 5 alike ("AMD EPYC"), and one oneDNN
  path on two of them need not round alike (docs/sweeps.md, "Runs from several
  machines"): the numbers tell them apart, e.g. "AMD EPYC (family 25, model 17)".
  """
  fields = client_loop.cpuinfo_fields()
  name = fields.get('model name') or platform.processor() or 'unknown CPU'
  if fields.get('cpu family') and fields.get('model'):
    name += f' (family {fields["cpu family"]}, model {fields["model"]})'
  return name


def onednn_env() -> Optional[bool]:
  """TF_ENABLE_ONEDNN_OPTS as a bool; None when unset (each binary's default)."""
  value = os.environ.get('TF_ENABLE_ONEDNN_OPTS')
  if value is None:
    return None
  return value.strip().lower() in ('1', 'true', 'yes', 'on')


def python_onednn() -> bool:
  """Whether this process's TensorFlow runs oneDNN kernels."""
  from tensorflow.python.util import _pywrap_util_port  # pylint: disable=g-import-not-at-top
  return bool(_pywrap_util_port.IsMklEnabled())


worker_onednn = client_loop.worker_onednn


def cpu_path() -> str:
  """The CPU, and whether this process's TensorFlow runs oneDNN kernels, in one line.

  `scripts.train` records it in each run's flags.json (`cpu_path_resolved`):
  the two oneDNN paths round differently, so the same flags and seed give
  other numbers on another path (README, "Same flags and --seed"). Measured on
  a Zen 3 without AVX-512: a 60-round 2NN run with `TF_ENABLE_ONEDNN_OPTS`
  unset equals the run with `=0` to the last bit, and differs with `=1`.
  """
  env = onednn_env()
  return (f'{cpu_model()}; AVX-512 {"yes" if client_loop.cpu_has_avx512() else "no"}; '
          f'oneDNN {"on" if python_onednn() else "off"} ('
          + ('TF_ENABLE_ONEDNN_OPTS unset' if env is None else f'TF_ENABLE_ONEDNN_OPTS={int(env)}')
          + ')')


@dataclasses.dataclass(frozen=True)
class Machine:
  cpu_model: str
  cores: int
  avx512: bool
  memory_gib: float
  onednn_env: Optional[bool]
  python_onednn: bool
  worker_onednn: bool
  tf_version: str
  tff_version: str
  load_at_start: tuple

  def header(self) -> str:
    """One line for a report."""
    env = ('unset' if self.onednn_env is None
           else f'TF_ENABLE_ONEDNN_OPTS={int(self.onednn_env)}')
    return (f'CPU: {self.cpu_model}, {self.cores} cores, AVX-512 '
            f'{"yes" if self.avx512 else "no"}, {self.memory_gib:.0f} GiB. oneDNN: '
            f'{env} -> Python TF {"on" if self.python_onednn else "off"}, TFF worker '
            f'{"on" if self.worker_onednn else "off"}. TF {self.tf_version}, TFF '
            f'{self.tff_version}. Load average at start: '
            + '/'.join(f'{x:.1f}' for x in self.load_at_start) + ' (1/5/15 min)')


def describe() -> Machine:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  return Machine(
      cpu_model=cpu_model(), cores=os.cpu_count() or 1,
      avx512=client_loop.cpu_has_avx512(),
      memory_gib=psutil.virtual_memory().total / 2**30, onednn_env=onednn_env(),
      python_onednn=python_onednn(), worker_onednn=worker_onednn(),
      tf_version=tf.__version__, tff_version=tff.__version__,
      load_at_start=tuple(os.getloadavg()))


def load_average() -> tuple:
  return tuple(os.getloadavg())


def cpu_seconds() -> float:
  """User + system CPU seconds of this process and its live descendants.

  The descendants include TFF's local C++ worker (and workers started by
  `runtime.local_workers`), where the rounds run. CPU time is far less
  sensitive than wall time to other load on a shared machine, so the CPU
  ratios are the steadier ones there. Workers started outside this process
  (`--workers`) are not counted.
  """
  me = psutil.Process()
  total = 0.0
  for proc in [me, *me.children(recursive=True)]:
    try:
      times = proc.cpu_times()
    except psutil.Error:  # exited meanwhile
      continue
    total += times.user + times.system
  return total
