"""Shakespeare, one client per speaking role: next-character and next-word tasks.

Data (LEAF, Caldas et al. 2018; TFF's `tff.simulation.datasets.shakespeare`,
715 roles, each role's lines split over train and test), in DESIGN.md order:
TFF's dataset (`shakespeare.sqlite` in `--cache_dir`, or downloaded when
online); TFF's HDF5 layout (`shakespeare_train.h5` / `shakespeare_test.h5`
with `/examples/<ROLE>/snippets`, a directory or .tar.xz given by
`--data_source=h5 --data_dir=...`); TFF's synthetic sample only with
`--data_source=synthetic`. TFF 0.87 no longer ships an HDF5 reader, so a
small h5py one is written here; it yields the same elements as TFF's
(`OrderedDict(snippets=tf.string)`).

* `shakespeare_char`: TFF's `baselines.shakespeare` char preprocessing
  (sequence length 80, pad 0 / OOV / BOS / EOS tokens) and its model
  (McMahan et al. 2017: embedding 8, two LSTMs, dense over the 90 tokens),
  with stable layer names `embedding`, `lstm1`, `lstm2`, `output`. Its loss
  is TFF's baseline loss, which also trains on padding labels (24% of the
  training labels; see `shakespeare_word`): kept so that results stay
  comparable with TFF's baseline.
* `shakespeare_word`: the real-data stand-in for Stack Overflow next-word
  prediction. Snippets are lower-cased, split into sentences at `.!?;:`,
  apostrophes dropped and every other non-letter turned into a word break;
  the vocabulary is the `--shakespeare_word_vocab_size` most frequent words of
  the training clients; sentences then go through TFF's Stack Overflow
  word-prediction preprocessing (`baselines.stackoverflow`: BOS, words,
  EOS, padded to `sequence_length + 1`). Word `vocab[i]` has token id `i + 1`
  (0 is padding; then OOV, BOS, EOS), which is the row of `embedding` and the
  unit of `output` that federated select slices for it. Accuracy excludes
  padding, OOV and EOS, as TFF's `MaskedCategoricalAccuracy` does for Stack
  Overflow. The loss skips padding labels (`data_utils.padding_ignoring_loss`):
  about two thirds of the labels are padding at sequence length 20, and TFF
  drops the Keras mask before the loss.
"""

import collections
import os
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import data_utils
from tasks import registry

_SQLITE = 'shakespeare.sqlite'
_H5_FILES = ('shakespeare_train.h5', 'shakespeare_test.h5')
_char_pre = tff.simulation.baselines.shakespeare.char_prediction_preprocessing
_word_pre = tff.simulation.baselines.stackoverflow.word_prediction_preprocessing
_keras_metrics = tff.simulation.baselines.keras_metrics
CHAR_VOCAB_SIZE = len(_char_pre.CHAR_VOCAB) + 4  # + pad, OOV, BOS, EOS


# ----------------------------------------------------------------------------
# Data.
def load_h5_shakespeare(data_dir: str, cache_dir: Optional[str] = None):
  """(train, test) `ClientData` from TFF's Shakespeare HDF5 files (dir or archive)."""
  import h5py  # pylint: disable=g-import-not-at-top
  root = data_utils.unpack_if_archive(
      data_dir, cache_dir, flag='--data_dir', must_contain=_H5_FILES)
  splits = []
  for name in _H5_FILES:
    path = os.path.join(root, name)
    per_client = collections.OrderedDict()
    try:
      with h5py.File(path, 'r') as f:
        for role, group in f['examples'].items():
          snippets = np.asarray(group['snippets'][()], dtype=object)
          if snippets.size:
            per_client[role] = collections.OrderedDict(snippets=snippets.reshape(-1))
    except (OSError, KeyError) as e:
      raise registry.TaskError(
          f'--data_dir={data_dir!r}: {path} is not a TFF Shakespeare HDF5 file '
          f'with /examples/<ROLE>/snippets ({e})') from e
    if not per_client:
      raise registry.TaskError(f'--data_dir={data_dir!r}: {path} holds no roles')
    splits.append(data_utils.client_data_from_arrays(per_client))
  return splits[0], splits[1]


def load_shakespeare(data_source: str, data_dir: Optional[str], cache_dir: Optional[str]):
  """(train, test, source) following DESIGN.md's order; never silently synthetic."""
  if data_source == 'synthetic':
    data = tff.simulation.datasets.shakespeare.get_synthetic()
    return data, data, 'synthetic'
  if data_source == 'h5':
    if not data_dir:
      raise registry.TaskError(
          '--data_source=h5 needs --data_dir (a directory or .tar.xz holding '
          'shakespeare_train.h5 and shakespeare_test.h5)')
    return (*load_h5_shakespeare(data_dir, cache_dir), 'h5')
  has_cache = bool(cache_dir) and os.path.exists(os.path.join(cache_dir, _SQLITE))
  if data_source == 'auto' and data_dir and not has_cache:
    return (*load_h5_shakespeare(data_dir, cache_dir), 'h5')
  try:
    return (*tff.simulation.datasets.shakespeare.load_data(cache_dir=cache_dir), 'tff')
  except Exception as e:  # pylint: disable=broad-except  (network errors vary)
    raise registry.TaskError(
        "TFF's Shakespeare could not be loaded (no "
        f"{os.path.join(cache_dir or '~/.tff', _SQLITE)} and no download: "
        f'{type(e).__name__}). Point at local data with --data_source=h5 '
        '--data_dir=<dir or .tar.xz with shakespeare_{train,test}.h5> (e.g. '
        '../shared/data/shakespeare_tff_h5.tar.xz), or use '
        + registry.synthetic_hint(3)) from e


def _description(kind, source, train, test, extra=''):
  return (f'Shakespeare {kind} from {source}: {len(train.client_ids)} train roles, '
          f'{len(test.client_ids)} test roles{extra}'
          + (' (SYNTHETIC: TFF get_synthetic)' if source == 'synthetic' else ''))


# ----------------------------------------------------------------------------
# Next-character prediction.
def create_char_model(sequence_length: int = 80, embedding_dim: int = 8,
                      units: int = 256, num_layers: int = 2) -> tf.keras.Model:
  """TFF's Shakespeare char model (McMahan et al. 2017) with stable names."""
  layers = [
      tf.keras.layers.Input(shape=(sequence_length,), dtype=tf.int64, name='chars'),
      tf.keras.layers.Embedding(CHAR_VOCAB_SIZE, embedding_dim, mask_zero=True,
                                name='embedding'),
  ]
  for i in range(1, num_layers + 1):
    layers.append(tf.keras.layers.LSTM(
        units, return_sequences=True, kernel_initializer='he_normal', name=f'lstm{i}'))
  layers.append(tf.keras.layers.Dense(CHAR_VOCAB_SIZE, name='output'))
  return tf.keras.Sequential(layers, name='shakespeare_char')


def _seq_loss():
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _check_char_hparams(**hparams) -> None:
  registry.check_positive_hparams('shakespeare_char', **hparams)


def char_model_from_hparams(*, sequence_length, embedding_dim, units, num_layers):
  """The registry's `model_fn` for `shakespeare_char`: its model, reading no data."""
  _check_char_hparams(sequence_length=sequence_length, embedding_dim=embedding_dim,
                      units=units, num_layers=num_layers)
  return create_char_model(sequence_length, embedding_dim, units, num_layers)


def create_char_task(*, train_client_spec, eval_client_spec, data_source, data_dir,
                     cache_dir, seed, sequence_length, embedding_dim, units,
                     num_layers) -> registry.Task:
  """`shakespeare_char`: TFF's char preprocessing and (named) model."""
  del seed  # natural split by role
  _check_char_hparams(sequence_length=sequence_length, embedding_dim=embedding_dim,
                      units=units, num_layers=num_layers)
  train, test, source = load_shakespeare(data_source, data_dir, cache_dir)
  pad, _, _, _ = _char_pre.get_special_tokens()

  def keras_model_fn():
    return create_char_model(sequence_length, embedding_dim, units, num_layers)

  def metrics_fn():
    return [_keras_metrics.MaskedCategoricalAccuracy(name='accuracy', masked_tokens=[pad])]

  baseline = registry.make_baseline_task(
      train_data=train,
      test_data=test,
      train_preprocess_fn=_char_pre.create_preprocess_fn(train_client_spec, sequence_length),
      eval_preprocess_fn=_char_pre.create_preprocess_fn(eval_client_spec, sequence_length),
      keras_model_fn=keras_model_fn,
      loss_fn=_seq_loss,
      metrics_fn=metrics_fn,
  )
  return registry.Task(
      name='shakespeare_char', baseline=baseline, keras_model_fn=keras_model_fn,
      loss_fn=_seq_loss, metrics_fn=metrics_fn, data_source=source,
      data_description=_description('next-char', source, train, test))


# ----------------------------------------------------------------------------
# Next-word prediction.
def snippet_to_sentences(snippet: tf.Tensor) -> tf.Tensor:
  """A snippet -> 1-D string tensor of sentences of space-separated words.

  Lower-case; line breaks are spaces; `.!?;:` end sentences; apostrophes are
  dropped ("o'er" -> "oer"); every other non-letter breaks words.
  """
  text = tf.strings.lower(snippet)
  text = tf.strings.regex_replace(text, "'", '')
  text = tf.strings.regex_replace(text, r'[.!?;:]+', '\n')
  sentences = tf.strings.split(text, sep='\n')
  sentences = tf.strings.strip(tf.strings.regex_replace(sentences, '[^a-z\n]+', ' '))
  return tf.boolean_mask(sentences, tf.strings.length(sentences) > 0)


def _to_sentence_dataset(dataset: tf.data.Dataset) -> tf.data.Dataset:
  return dataset.flat_map(lambda e: tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(tokens=snippet_to_sentences(e['snippets']))))


def build_word_vocab(train: tff.simulation.datasets.ClientData, vocab_size: int) -> list[str]:
  """The `vocab_size` most frequent words over all training clients.

  Ties are broken alphabetically, so the vocabulary is deterministic.
  """
  counts = collections.Counter()
  dataset = train.create_tf_dataset_from_all_clients().map(
      lambda e: tf.strings.reduce_join(snippet_to_sentences(e['snippets']), separator=' '))
  for text in dataset.batch(256).as_numpy_iterator():
    for line in text:
      counts.update(line.decode().split())
  ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
  return [w for w, _ in ranked[:vocab_size]]


def create_word_model(vocab_size: int, sequence_length: int = 20, embedding_dim: int = 96,
                      units: int = 256) -> tf.keras.Model:
  """embedding -> LSTM -> dense over the extended vocabulary (+ pad/OOV/BOS/EOS)."""
  extended = vocab_size + 4
  return tf.keras.Sequential([
      tf.keras.layers.Input(shape=(sequence_length,), dtype=tf.int64, name='words'),
      tf.keras.layers.Embedding(extended, embedding_dim, mask_zero=True, name='embedding'),
      tf.keras.layers.LSTM(units, return_sequences=True, name='lstm1'),
      tf.keras.layers.Dense(extended, name='output'),
  ], name='shakespeare_word')


def word_metrics_fn(vocab_size: int):
  special = _word_pre.get_special_tokens(vocab_size, num_out_of_vocab_buckets=1)

  def metrics_fn():
    return [_keras_metrics.MaskedCategoricalAccuracy(
        name='accuracy',
        masked_tokens=[special.padding, special.end_of_sentence] + special.out_of_vocab)]

  return metrics_fn


def _check_word_hparams(**hparams) -> None:
  registry.check_positive_hparams('shakespeare_word', **hparams)


def word_model_from_hparams(*, vocab_size, sequence_length, embedding_dim, units):
  """The registry's `model_fn` for `shakespeare_word`: its model, reading no data.

  The vocabulary's words come from the data; its size, and so the model, does not.
  """
  _check_word_hparams(vocab_size=vocab_size, sequence_length=sequence_length,
                      embedding_dim=embedding_dim, units=units)
  return create_word_model(vocab_size, sequence_length, embedding_dim, units)


def create_word_task(*, train_client_spec, eval_client_spec, data_source, data_dir,
                     cache_dir, seed, vocab_size, sequence_length, embedding_dim,
                     units) -> registry.Task:
  """`shakespeare_word`: sentences of words, TFF Stack Overflow preprocessing."""
  del seed  # natural split by role
  _check_word_hparams(vocab_size=vocab_size, sequence_length=sequence_length,
                      embedding_dim=embedding_dim, units=units)
  train, test, source = load_shakespeare(data_source, data_dir, cache_dir)
  vocab = build_word_vocab(train, vocab_size)
  # Synthetic data has few words: placeholders keep the model's shape that
  # of the flags, so that parameter counts and bytes match a real run.
  vocab += [f'<unused{i}>' for i in range(vocab_size - len(vocab))]

  def preprocess(spec):
    tff_fn = _word_pre.create_preprocess_fn(spec, vocab, sequence_length)
    return lambda dataset: tff_fn(_to_sentence_dataset(dataset))

  def keras_model_fn():
    return create_word_model(vocab_size, sequence_length, embedding_dim, units)

  metrics_fn = word_metrics_fn(vocab_size)
  baseline = registry.make_baseline_task(
      train_data=train,
      test_data=test,
      train_preprocess_fn=preprocess(train_client_spec),
      eval_preprocess_fn=preprocess(eval_client_spec),
      keras_model_fn=keras_model_fn,
      loss_fn=data_utils.padding_ignoring_loss,
      metrics_fn=metrics_fn,
  )
  return registry.Task(
      name='shakespeare_word', baseline=baseline, keras_model_fn=keras_model_fn,
      loss_fn=data_utils.padding_ignoring_loss, metrics_fn=metrics_fn, data_source=source,
      oov_token=_word_pre.get_special_tokens(
          vocab_size, num_out_of_vocab_buckets=1).out_of_vocab[0],
      data_description=_description(
          'next-word', source, train, test,
          f', vocabulary {vocab_size} most frequent training words'))


_SOURCES = ('auto', 'tff', 'h5', 'synthetic')
registry.register_task(
    'shakespeare_char', create_char_task, flag_prefix='shakespeare_char',
    hparams=collections.OrderedDict(
        sequence_length=_char_pre.DEFAULT_SEQUENCE_LENGTH, embedding_dim=8, units=256,
        num_layers=2),
    hparam_help={
        'sequence_length': 'characters per example (TFF: 80)',
        'embedding_dim': 'character embedding size',
        'units': 'LSTM units per layer',
        'num_layers': 'number of LSTM layers (lstm1, lstm2, ...)',
    },
    data_sources=_SOURCES,
    description='Shakespeare next-character prediction, one client per role',
    model_fn=char_model_from_hparams)
registry.register_task(
    'shakespeare_word', create_word_task, flag_prefix='shakespeare_word',
    hparams=collections.OrderedDict(
        vocab_size=2000, sequence_length=20, embedding_dim=96, units=256),
    hparam_help={
        'vocab_size': 'most frequent training words in the vocabulary',
        'sequence_length': 'words per example (sentences are padded/truncated)',
        'embedding_dim': 'word embedding size',
        'units': 'LSTM units',
    },
    data_sources=_SOURCES,
    description='Shakespeare next-word prediction (real-data stand-in for Stack Overflow)',
    model_fn=word_model_from_hparams)
