"""Shared doubles of the runtime tests: a tiny FedAvg and its clients."""

import collections
import ipaddress
import socket

from absl.testing import absltest
import numpy as np
import psutil
import tensorflow as tf
import tensorflow_federated as tff

from tff_partial import runtime

NUM_CLIENTS = 3


def keras_model():
  return tf.keras.Sequential([
      tf.keras.layers.Input((4,)),
      tf.keras.layers.Dense(
          3, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1),
          name='dense'),
  ])


INPUT_SPEC = collections.OrderedDict(
    x=tf.TensorSpec([None, 4], tf.float32), y=tf.TensorSpec([None, 1], tf.int32))


def model_fn():
  return tff.learning.models.from_keras_model(
      keras_model(),
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=INPUT_SPEC)


def client_data(num_clients: int = NUM_CLIENTS):
  rng = np.random.default_rng(7)
  return [
      tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
          x=rng.normal(size=(5 + i, 4)).astype(np.float32),
          y=rng.integers(0, 3, size=(5 + i, 1)).astype(np.int32))).batch(2)
      for i in range(num_clients)
  ]


def fedavg_process():
  return tff.learning.algorithms.build_weighted_fed_avg(
      model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=0.5),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0))


def weights(process, state):
  return [np.asarray(w) for w in
          tf.nest.flatten(process.get_model_weights(state).trainable)]


def train(process, data, rounds, state=None):
  state = process.initialize() if state is None else state
  for _ in range(rounds):
    state = process.next(state, data).state
  return state


class RuntimeTestCase(absltest.TestCase):
  """Each test starts on the local runtime with a fresh tiny FedAvg."""

  def setUp(self):
    super().setUp()
    runtime.configure(None)
    self.addCleanup(runtime.configure, None)
    self.process = fedavg_process()
    self.data = client_data()

  def train(self, rounds, state=None):
    return train(self.process, self.data, rounds, state)

  def assert_close(self, expected, actual):
    self.assertLen(actual, len(expected))
    for a, b in zip(expected, actual):
      # Sub-round sums are merged in a different order than one worker adds.
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def host_addresses() -> list[str]:
  """This machine's own non-loopback, non-link-local IP addresses."""
  found = []
  for addrs in psutil.net_if_addrs().values():
    for a in addrs:
      if a.family not in (socket.AF_INET, socket.AF_INET6):
        continue
      ip = ipaddress.ip_address(a.address.split('%')[0])
      if not (ip.is_loopback or ip.is_link_local):
        found.append(str(ip))
  return found


def accepts(host: str, port: int, timeout_s: float = 2.0) -> bool:
  """Whether a TCP connection to host:port (an address of this machine) opens."""
  family = socket.AF_INET6 if ':' in host else socket.AF_INET
  with socket.socket(family, socket.SOCK_STREAM) as s:
    s.settimeout(timeout_s)
    try:
      s.connect((host, port))
      return True
    except OSError:
      return False
