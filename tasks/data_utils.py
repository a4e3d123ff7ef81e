"""Small data helpers shared by the task modules (local archives, in-memory clients)."""

import errno
import hashlib
import os
import tarfile
from typing import Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import registry

_ARCHIVE_SUFFIXES = ('.tar.xz', '.tar.gz', '.tgz', '.tar')


def padding_ignoring_loss(pad_token: int = 0) -> tf.keras.losses.Loss:
  """Sparse softmax cross-entropy over logits that skips labels == `pad_token`.

  The mean is over the non-padding labels of the batch. Keras's own
  `ignore_class` does the masking. It is needed because TFF's
  `from_keras_model` runs the model inside a `tf.function`
  (`predict_on_batch`), so the `_keras_mask` that `Embedding(mask_zero=True)`
  attaches to the predictions never reaches the loss: with a plain
  `SparseCategoricalCrossentropy` every padding position is trained on
  (TFF's TODO b/145308951), and on short sentences that makes "padding" the
  argmax at every position.
  """
  return tf.keras.losses.SparseCategoricalCrossentropy(
      from_logits=True, ignore_class=pad_token)


def default_cache_dir() -> str:
  return os.environ.get(
      'TFF_PARTIAL_CACHE', os.path.join(os.path.expanduser('~'), '.cache', 'tff_partial'))


def unpack_if_archive(path: str, cache_dir: Optional[str], *, flag: str,
                      must_contain: Sequence[str] = ()) -> str:
  """Returns a directory: `path` itself, or where its archive is unpacked.

  An archive is unpacked once into `<cache_dir>/<name>-<hash of size+mtime>`
  (atomically: into a temporary directory, then renamed), so several test
  processes can share it. The top-level folder of the archive is descended
  into when the archive holds just one.
  """
  if not os.path.exists(path):
    raise registry.TaskError(f'{flag}={path!r} does not exist')
  if os.path.isdir(path):
    root = path
  elif path.endswith(_ARCHIVE_SUFFIXES):
    stat = os.stat(path)
    key = hashlib.sha256(f'{os.path.abspath(path)}:{stat.st_size}:{stat.st_mtime_ns}'.encode()).hexdigest()[:12]
    base = os.path.basename(path)
    for suffix in _ARCHIVE_SUFFIXES:
      if base.endswith(suffix):
        base = base[: -len(suffix)]
        break
    cache = cache_dir or default_cache_dir()
    root = os.path.join(cache, f'{base}-{key}')
    if not os.path.isdir(root):
      os.makedirs(cache, exist_ok=True)
      tmp = f'{root}.tmp{os.getpid()}'
      try:
        with tarfile.open(path) as tar:
          tar.extractall(tmp, filter='data')
        os.rename(tmp, root)
      except OSError as e:
        # Another process won the race: renaming onto its (non-empty)
        # directory fails with EEXIST or ENOTEMPTY; use its copy.
        if not (e.errno in (errno.EEXIST, errno.ENOTEMPTY) and os.path.isdir(root)):
          raise registry.TaskError(f'{flag}={path!r} could not be unpacked: {e}') from e
      except tarfile.TarError as e:
        raise registry.TaskError(f'{flag}={path!r} could not be unpacked: {e}') from e
      finally:
        if os.path.isdir(tmp):
          import shutil  # pylint: disable=g-import-not-at-top
          shutil.rmtree(tmp, ignore_errors=True)
  else:
    raise registry.TaskError(
        f'{flag}={path!r} is neither a directory nor an archive ({", ".join(_ARCHIVE_SUFFIXES)})')
  # Descend through single top-level folders until the expected entries appear.
  while must_contain and not all(os.path.exists(os.path.join(root, m)) for m in must_contain):
    entries = [e for e in os.listdir(root) if not e.startswith('.')]
    subdirs = [e for e in entries if os.path.isdir(os.path.join(root, e))]
    if len(subdirs) != 1:
      raise registry.TaskError(
          f'{flag}={path!r} does not contain {", ".join(must_contain)}')
    root = os.path.join(root, subdirs[0])
  return root


class InMemoryClientData(tff.simulation.datasets.TestClientData):
  """TFF's in-memory `ClientData`, with a fast all-clients dataset.

  `TestClientData` builds its all-clients dataset through a graph lookup table
  per client; for evaluation on every test client we only need the examples
  concatenated, which this does on the host arrays.
  """

  def __init__(self, per_client: Mapping[str, Mapping[str, np.ndarray]]):
    super().__init__(per_client)
    self._arrays = per_client

  def create_tf_dataset_from_all_clients(self, seed=None) -> tf.data.Dataset:
    first = next(iter(self._arrays.values()))
    merged = {k: np.concatenate([c[k] for c in self._arrays.values()]) for k in first}
    if seed is not None:
      # A permutation of the host arrays: the same order in every process
      # (`Dataset.shuffle`'s depends on the global TF seed).
      order = np.random.RandomState(seed).permutation(len(merged[next(iter(first))]))
      merged = {k: v[order] for k, v in merged.items()}
    return tf.data.Dataset.from_tensor_slices(type(first)(
        (k, merged[k]) for k in first))


def client_data_from_arrays(
    per_client: Mapping[str, Mapping[str, np.ndarray]]
) -> tff.simulation.datasets.ClientData:
  """An in-memory `ClientData` from {client_id: {feature: array}}."""
  return InMemoryClientData(per_client)
