"""pytest setup: absl flags are parsed once (tf.test.main does it under Bazel)."""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import flags  # pylint: disable=g-import-not-at-top
import pytest  # pylint: disable=g-import-not-at-top


def pytest_configure(config):
  del config
  if not flags.FLAGS.is_parsed():
    flags.FLAGS(['pytest'], known_only=True)


@pytest.fixture(autouse=True)
def _restore_op_determinism():
  """Undoes what a binary's main() run in-process turned on (--deterministic).

  Op determinism makes TF refuse unseeded random ops in this process, so it
  must not leak from one test into the next test of the same pytest worker.
  """
  saved = os.environ.get('TF_DETERMINISTIC_OPS')
  yield
  if os.environ.get('TF_DETERMINISTIC_OPS') != saved:
    if saved is None:
      os.environ.pop('TF_DETERMINISTIC_OPS', None)
    else:
      os.environ['TF_DETERMINISTIC_OPS'] = saved
    if 'tensorflow' in sys.modules and saved != '1':
      from tensorflow.python.framework import config  # pylint: disable=g-import-not-at-top
      config.disable_op_determinism()
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      tf.random.set_seed(None)  # determinism.configure's global seed
    # TFF's local worker read the variable when it started: a fresh one.
    if 'tff_partial.runtime' in sys.modules:
      from tff_partial.runtime import local  # pylint: disable=g-import-not-at-top
      local.install()
