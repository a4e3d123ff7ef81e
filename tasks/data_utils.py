"""Small data helpers shared by the task modules (local archives, in-memory clients)."""

import errno
import hashlib
import os
import tarfile
from typing import Any, Callable, Mapping, Optional, Sequence

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


def tokenizing_preprocess_fn(
    spec: tff.simulation.baselines.ClientSpec,
    to_ids: Callable[[Any], tf.Tensor],
    finish: Callable[[tf.data.Dataset], tf.data.Dataset],
    default_shuffle_buffer_size: int,
) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
  """TFF's baseline text preprocessing with its tokenizer built once per task.

  The word, tag and character preprocessing of `tff.simulation.baselines`
  each do, per dataset: shuffle (when `spec.shuffle_buffer_size` > 1), repeat
  `spec.num_epochs`, take `spec.max_elements`, map a tokenizer, then batch
  (`finish`). But they build the tokenizer, a `tf.lookup.StaticVocabularyTable`
  of the whole vocabulary, anew on every call, i.e. for every client of every
  round, and TensorFlow never returns an eagerly built table's memory (nor all
  of a traced map function's). Measured with TF 2.14 (issue 16): 0.85 MB of
  RSS kept per 10,000-word table, after `gc.collect()` (a DP
  `shakespeare_word` run of 20 clients a round grew by 24-30 MB a round;
  `registry.Task.preprocess_train_client` removes the rest).
  This does the same steps in the same order with `to_ids` (and the table it
  holds) built once by the caller, so the batches are the same.
  `default_shuffle_buffer_size`: the buffer where `spec` gives none (TFF's
  constant of the same preprocessing).
  """
  shuffle_buffer_size = spec.shuffle_buffer_size
  if shuffle_buffer_size is None:
    shuffle_buffer_size = default_shuffle_buffer_size

  def preprocess_fn(dataset: tf.data.Dataset) -> tf.data.Dataset:
    if shuffle_buffer_size > 1:
      dataset = dataset.shuffle(shuffle_buffer_size)
    if spec.num_epochs > 1:
      dataset = dataset.repeat(spec.num_epochs)
    if spec.max_elements is not None:
      dataset = dataset.take(spec.max_elements)
    return finish(dataset.map(to_ids, num_parallel_calls=tf.data.AUTOTUNE))

  return preprocess_fn


_word_pre = tff.simulation.baselines.stackoverflow.word_prediction_preprocessing


def word_preprocess_fn(spec: tff.simulation.baselines.ClientSpec, vocab: list[str],
                       sequence_length: int) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
  """TFF's Stack Overflow next-word preprocessing (`word_prediction_preprocessing.
  create_preprocess_fn`, one out-of-vocabulary bucket) with its vocabulary
  table built once (`tokenizing_preprocess_fn`)."""
  if not vocab or sequence_length < 1:
    raise ValueError(f'need a non-empty vocab and sequence_length >= 1, got '
                     f'{len(vocab)} words and {sequence_length}')
  return tokenizing_preprocess_fn(
      spec, _word_pre.build_to_ids_fn(vocab, sequence_length),
      lambda dataset: _word_pre.batch_and_split(dataset, sequence_length, spec.batch_size),
      tff.simulation.baselines.stackoverflow.constants.DEFAULT_SHUFFLE_BUFFER_SIZE)
