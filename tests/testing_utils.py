"""Shared test helpers: real data from ../shared/data, tiny tasks."""

import contextlib
import io
import os
import re
import sys

import tensorflow_federated as tff

_REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))

# TensorFlow's C++ runtime may log at import (e.g. 'Unable to register cuDNN
# factory' where CUDA libraries are installed); those lines are TF's.
_TF_LOG_LINE = re.compile(r'^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] ')


def own_stderr_lines(stderr: str) -> list:
  """A binary's stderr lines without TensorFlow's C++ log lines."""
  return [line for line in stderr.strip().splitlines() if not _TF_LOG_LINE.match(line)]


def shared_data_dir() -> str:
  """`../shared/data` beside the repository (override: TFF_PARTIAL_SHARED_DATA)."""
  return os.environ.get(
      'TFF_PARTIAL_SHARED_DATA', os.path.join(os.path.dirname(_REPO), 'shared', 'data'))


def shared_data(name: str) -> str:
  path = os.path.join(shared_data_dir(), name)
  if not os.path.exists(path):
    raise FileNotFoundError(
        f'{path} is missing: tests read real data from ../shared/data '
        '(set TFF_PARTIAL_SHARED_DATA to point elsewhere)')
  return path


def cache_dir() -> str:
  """A cache shared by test processes for unpacked archives."""
  path = os.environ.get('TFF_PARTIAL_TEST_CACHE', '/tmp/tff_partial_test_cache')
  os.makedirs(path, exist_ok=True)
  return path


FEMNIST = 'femnist_leaf_sample.tar.xz'
SHAKESPEARE_H5 = 'shakespeare_tff_h5.tar.xz'
CIFAR10_JPG = 'cifar10_jpg.tar.xz'
TINYSHAKESPEARE = 'tinyshakespeare.txt'


def client_spec(epochs=1, batch_size=20, max_elements=None):
  return tff.simulation.baselines.ClientSpec(
      num_epochs=epochs, batch_size=batch_size, shuffle_buffer_size=1,
      max_elements=max_elements)


def femnist_task(name='emnist_cnn', batch_size=20, max_elements=None):
  """A task on the real FEMNIST sample of ../shared/data (LEAF json)."""
  from tasks import registry  # pylint: disable=g-import-not-at-top
  return registry.create_task(
      name,
      train_client_spec=client_spec(batch_size=batch_size, max_elements=max_elements),
      data_source='leaf',
      data_dir=shared_data(FEMNIST),
      cache_dir=cache_dir(),
  )


def method_context(task, client_lr=0.1, seed=0, aggregator=None):
  """MethodContext with client SGD(client_lr) and server SGD(1.0)."""
  from tff_partial.training import method  # pylint: disable=g-import-not-at-top
  return method.MethodContext(
      task=task,
      client_optimizer=tff.learning.optimizers.build_sgdm(learning_rate=client_lr),
      server_optimizer=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
      model_aggregator=aggregator,
      seed=seed,
  )


def deterministic_ops(test_case) -> None:
  """Turns on what `scripts.train --deterministic` does, for the rest of `test_case`.

  Op determinism (`tff_partial/training/determinism.py`) in this process and in
  a fresh TFF local worker (the worker reads it when it starts), so that a
  learning test gives the same numbers in every run on a CPU path: with a
  parallel `tf.data` map, random ops (CIFAR-10's crops and flips) otherwise
  reach the images in a varying order. Undone when the test ends, so that the
  next test of the same process runs as before.
  """
  from tff_partial.runtime import local  # pylint: disable=g-import-not-at-top
  from tff_partial.training import determinism  # pylint: disable=g-import-not-at-top
  saved = os.environ.get(determinism.ENV_VAR)
  determinism.configure(True)
  local.install()
  test_case.addCleanup(restore_op_determinism, saved)


def restore_op_determinism(saved) -> None:
  """Sets op determinism back to `saved` (TF_DETERMINISTIC_OPS's earlier value).

  Turning it off also clears `determinism.configure`'s global seed and starts
  a fresh TFF local worker, which read the variable when it started.
  """
  if os.environ.get('TF_DETERMINISTIC_OPS') == saved:
    return
  if saved is None:
    os.environ.pop('TF_DETERMINISTIC_OPS', None)
  else:
    os.environ['TF_DETERMINISTIC_OPS'] = saved
  if 'tensorflow' in sys.modules and saved != '1':
    from tensorflow.python.framework import config  # pylint: disable=g-import-not-at-top
    config.disable_op_determinism()
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.random.set_seed(None)  # determinism.configure's global seed
  if 'tff_partial.runtime' in sys.modules:
    from tff_partial.runtime import local  # pylint: disable=g-import-not-at-top
    local.install()


def train_and_assert_learns(test_case, task, built, *, rounds, min_accuracy,
                            clients_per_round=10, seed=0, loss_check='test',
                            min_loss_drop=0.1):
  """Trains with the one loop; asserts test accuracy and a falling test loss.

  The test loss is compared with the untrained model's on the same test
  examples. (Round train losses are means over different clients each round:
  too noisy to compare at 10 clients. PVT at 90% frozen failed a CI run on
  "mean of the last 5 rounds below the first 5": 3.89 vs 3.81, while its test
  loss fell 4.14 -> 3.85-3.92 in three measured runs.)
  loss_check: 'test' (the final test loss at least `min_loss_drop` below the
    untrained model's); 'train' (the clients' loss of the last 5 rounds below
    the first 5, for methods whose server model is not what the clients train:
    federated select); None (accuracy only, where neither is reliable).
  """
  if loss_check not in ('test', 'train', None):
    raise ValueError(f"loss_check={loss_check!r}; valid values: 'test', 'train', None")
  from tff_partial.training import loop  # pylint: disable=g-import-not-at-top
  # The model the loop trains from (seeded by `seed`), not a fresh
  # `process.initialize()`: that one draws other unseeded weights in each
  # process (its test loss differed by 0.04 between two runs).
  initial = loop.evaluate(task, loop.initial_model_weights(task, seed))
  result = loop.run_training(
      task, built, total_rounds=rounds, clients_per_round=clients_per_round, seed=seed,
      output_dir=None, rounds_per_eval=rounds, print_fn=print)
  print(f'test loss {initial["loss"]:.4f} -> {result.final_eval["loss"]:.4f}, '
        f'accuracy {result.final_eval["accuracy"]:.4f}')
  test_case.assertGreater(result.final_eval['accuracy'], min_accuracy)
  if loss_check == 'test':
    test_case.assertLess(result.final_eval['loss'], initial['loss'] - min_loss_drop)
  elif loss_check == 'train':
    losses = [m['client_work/train/loss'] for m in result.round_metrics
              if 'client_work/train/loss' in m]
    print('train losses', [round(float(x), 3) for x in losses])
    test_case.assertLess(sum(losses[-5:]) / 5, sum(losses[:5]) / 5)
  return result


class _Capture(io.StringIO):
  """Captures Python prints; subprocesses (TFF's C++ worker) keep the real fd."""

  def __init__(self, real):
    super().__init__()
    self._real = real

  def fileno(self):
    return self._real.fileno()


def run_train_main(**flag_values):
  """Runs `scripts.train.main` under flag values: (exit code, stdout, stderr)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from absl.testing import flagsaver  # pylint: disable=g-import-not-at-top
  from scripts import train  # pylint: disable=g-import-not-at-top
  out, err = _Capture(sys.__stdout__), _Capture(sys.__stderr__)
  code = 0
  if not flags.FLAGS.is_parsed():
    flags.FLAGS(['train'])
  with flagsaver.flagsaver(**flag_values):
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      try:
        train.main(['train'])
      except SystemExit as e:
        code = e.code
  return code, out.getvalue(), err.getvalue()


def load_npz_weights(path):
  """The arrays of a `model_weights.npz` (arr_0, arr_1, ...) in order."""
  from tff_partial.training import loop  # pylint: disable=g-import-not-at-top
  return loop.read_model_weights(path)
