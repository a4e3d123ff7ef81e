"""pytest setup: absl flags are parsed once (tf.test.main does it under Bazel)."""

import os

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
    from tests import testing_utils  # pylint: disable=g-import-not-at-top
    testing_utils.restore_op_determinism(saved)
