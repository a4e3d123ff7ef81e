"""Tests of tff_partial.runtime: rounds on several TFF workers."""

import asyncio
import collections
import shutil
import tempfile
import threading
import time

from absl.testing import absltest
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_partial import runtime
from tff_partial.runtime import workers as workers_lib

_NUM_CLIENTS = 3


def _model_fn():
  keras_model = tf.keras.Sequential([
      tf.keras.layers.Input((4,)),
      tf.keras.layers.Dense(3, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1),
                            name='dense'),
  ])
  input_spec = collections.OrderedDict(
      x=tf.TensorSpec([None, 4], tf.float32), y=tf.TensorSpec([None, 1], tf.int32))
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=input_spec)


def _client_data():
  rng = np.random.default_rng(7)
  return [
      tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
          x=rng.normal(size=(5 + i, 4)).astype(np.float32),
          y=rng.integers(0, 3, size=(5 + i, 1)).astype(np.int32))).batch(2)
      for i in range(_NUM_CLIENTS)
  ]


def _process():
  return tff.learning.algorithms.build_weighted_fed_avg(
      _model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=0.5),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0))


def _weights(process, state):
  return [np.asarray(w) for w in tf.nest.flatten(process.get_model_weights(state).trainable)]


class RuntimeTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    runtime.configure(None)
    self.addCleanup(runtime.configure, None)
    self.process = _process()
    self.data = _client_data()

  def _train(self, rounds, state=None):
    state = self.process.initialize() if state is None else state
    for _ in range(rounds):
      state = self.process.next(state, self.data).state
    return state

  def test_two_workers_give_the_local_result(self):
    initial = _weights(self.process, self.process.initialize())
    local = _weights(self.process, self._train(2))
    with runtime.local_workers(2) as workers:
      runtime.configure(workers.addresses)
      self.assertEqual(runtime.configured_workers(), workers.addresses)
      remote = _weights(self.process, self._train(2))
    self.assertLen(remote, len(local))
    for a, b in zip(local, remote):
      # Sub-round sums are merged in a different order than one worker adds.
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    # The rounds trained something (the test would pass on a no-op otherwise).
    self.assertGreater(np.max(np.abs(local[0] - initial[0])), 1e-3)

  def test_killed_worker_fails_clearly_and_run_resumes(self):
    expected = _weights(self.process, self._train(2))
    root = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, root, ignore_errors=True)
    checkpoints = tff.program.FileProgramStateManager(root)
    with runtime.local_workers(2) as workers:
      runtime.configure(workers.addresses)
      state = self._train(1)
      asyncio.run(checkpoints.save(state, 1))
      workers[1].kill()
      start = time.monotonic()
      with self.assertRaisesRegex(runtime.WorkerError,
                                  f'worker {workers[1].address} is unreachable'):
        self._train(1, state)
      self.assertLess(time.monotonic() - start, 30.0)  # no hang
    # Resume: new workers, the same flags, the last checkpoint.
    with runtime.local_workers(2) as workers:
      runtime.configure(workers.addresses)
      restored, version = asyncio.run(
          checkpoints.load_latest(self.process.initialize()))
      self.assertEqual(version, 1)
      resumed = _weights(self.process, self._train(1, restored))
    for a, b in zip(expected, resumed):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)

  def test_worker_killed_while_rounds_run_fails_without_hang(self):
    with runtime.local_workers(2) as workers:
      runtime.configure(workers.addresses)
      state = self._train(1)  # compiled and warm
      killer = threading.Timer(1.0, workers[0].kill)
      killer.start()
      self.addCleanup(killer.cancel)
      with self.assertRaisesRegex(runtime.WorkerError, workers[0].address):
        for _ in range(500):  # rounds keep running until the worker dies
          state = self.process.next(state, self.data).state
      killer.join()
      self.assertFalse(workers[0].alive())

  def test_rejects_non_loopback_and_malformed_addresses(self):
    with self.assertRaisesRegex(ValueError, 'not a loopback address'):
      runtime.configure(['10.0.0.1:5000'])
    with self.assertRaisesRegex(ValueError, 'not host:port'):
      runtime.configure(['127.0.0.1'])
    with self.assertRaisesRegex(ValueError, 'duplicate'):
      runtime.configure(['127.0.0.1:5000', '127.0.0.1:5000'])

  def test_unreachable_worker_fails_at_configure(self):
    port = workers_lib.portpicker.pick_unused_port()
    with self.assertRaisesRegex(runtime.WorkerError, 'did not become reachable'):
      runtime.configure([f'127.0.0.1:{port}'], ready_timeout_s=1.0)


if __name__ == '__main__':
  absltest.main()
