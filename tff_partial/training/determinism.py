"""Bit-identical runs: TensorFlow's op determinism, in this process and TFF's worker.

TFF runs computations in its C++ `worker_binary`, a separate process that
reads TensorFlow's `TF_DETERMINISTIC_OPS` environment variable when it
starts; `tf.config.experimental.enable_op_determinism()` alone reaches only
the Python process (Keras evaluation, local adaptation). `configure(True)`
sets both, so it must run before TFF starts its worker (the binaries call it
first thing). Workers started elsewhere (`--workers`) need the variable in
their own environment.

What op determinism changes here (measured, tests/determinism_test.py):
TFF's EMNIST preprocessing maps batches with `deterministic=False`, so under
load the batches of a client could reach the model in another order; op
determinism forces every `tf.data` map to keep its order and runs map
functions with stateful random ops serially.

The other sources of run-to-run differences are removed unconditionally by
the training loop (`tff_partial.training.loop.seeded_shuffle`).

Across machines: TensorFlow sizes a process's intra-op pool by its core count,
and multi-threaded kernels (Eigen's contractions on the oneDNN-off path) split
their sums by the pool size, so the same values round differently on 1 and 2
cores. Clients train on one thread each (`--local_client_parallelism=auto`);
`configure` (via `fix_intra_op_threads`) gives the binary's own process
(Keras evaluation, local adaptation) a fixed pool size.
"""

import os

from absl import logging
import tensorflow as tf
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import

ENV_VAR = 'TF_DETERMINISTIC_OPS'
# The intra-op pool of a binary's own process, whatever the machine's core
# count: the 2 cores of the machines this package is tested on, so their
# evaluation speed is unchanged.
PROCESS_INTRA_OP_THREADS = 2


def fix_intra_op_threads(threads: int = PROCESS_INTRA_OP_THREADS) -> bool:
  """Sizes this process's TensorFlow intra-op pool to `threads`.

  Must run before TensorFlow executes its first op; returns False (and
  changes nothing) if it is too late. Only this process: TFF's worker and
  the package's local workers size their own pools.
  """
  try:
    tf.config.threading.set_intra_op_parallelism_threads(int(threads))
  except RuntimeError:  # TensorFlow's context is already initialized.
    if tf.config.threading.get_intra_op_parallelism_threads() == int(threads):
      return True
    logging.warning('TensorFlow already runs: its intra-op pool stays at its size, so this '
                    "process's evaluation rounds as on this machine's core count")
    return False
  return True


def configure(deterministic: bool) -> None:
  """Fixes this process's intra-op pool (always, `fix_intra_op_threads`) and
  turns op determinism on (True) or leaves TensorFlow's default (False).

  Call first thing, before TensorFlow runs an op and before the first TFF
  computation: TFF's local worker inherits the environment when it starts.
  """
  fix_intra_op_threads()
  if deterministic:
    os.environ[ENV_VAR] = '1'
    tf.config.experimental.enable_op_determinism()
    # Op determinism refuses random ops with neither a global nor an op seed,
    # e.g. the Keras initializers and Dropout of a model built only to read
    # its layers. A fixed global seed where none is set; what training
    # computes is seeded by the loop from --seed.
    if context.global_seed() is None:
      tf.random.set_seed(0)

