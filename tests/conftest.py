"""pytest setup: absl flags are parsed once (tf.test.main does it under Bazel)."""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import flags  # pylint: disable=g-import-not-at-top


def pytest_configure(config):
  del config
  if not flags.FLAGS.is_parsed():
    flags.FLAGS(['pytest'], known_only=True)
