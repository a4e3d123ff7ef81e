"""Shared test helpers: real data from ../shared/data, tiny tasks."""

import os

import tensorflow_federated as tff

_REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


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
