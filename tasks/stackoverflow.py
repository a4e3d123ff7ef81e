"""Stack Overflow: next-word prediction (transformer) and tag prediction (LR).

Data: TFF's `tff.simulation.datasets.stackoverflow` (342,477 users; the
`stackoverflow.sqlite` database in `--cache_dir`, or downloaded when online),
its word and tag counts (`stackoverflow.word_count` / `stackoverflow.tag_count`
in `--cache_dir` or `--cache_dir`/datasets, or downloaded); TFF's synthetic
sample (`get_synthetic()`, three users, with `get_synthetic_word_counts()` /
`get_synthetic_tag_counts()`) only with `--data_source=synthetic`. There is
no public local format besides TFF's, so `auto` without the database is an
error that says how to get it.

* `stackoverflow_nwp` (FedPT section 4 / appendix; Federated Select): TFF's
  word-prediction preprocessing (`baselines.stackoverflow`: vocabulary of the
  10,000 most frequent words, sentences truncated/padded to 20, tokens pad 0,
  words 1..V, OOV V+1, BOS V+2, EOS V+3), at most 256 sentences per training
  client, and a 3-layer transformer encoder with a causal mask (embedding dim
  96, 8 heads of 12, FFN 2048 with ReLU, dropout 0.1). Layer names:
  `embedding`, `position_embedding`, `encoder{i}_attention`,
  `encoder{i}_norm{1,2}`, `encoder{i}_ffn1` (frozen by FedPT one block at a
  time), `encoder{i}_ffn2`. By default (`--stackoverflow_nwp_tie_embeddings`)
  the output logits reuse the embedding matrix (`TiedEmbedding`, plus an
  output bias): 2,271,284 parameters, FedPT's model (its Table 3 fractions);
  with `--stackoverflow_nwp_tie_embeddings=false` a separate `output` Dense
  layer (3,231,668). Accuracy excludes padding, OOV and EOS
  (TFF's `keras_metrics.MaskedCategoricalAccuracy`); the loss skips padding labels
  (`data_utils.padding_ignoring_loss`).
* `stackoverflow_tags` (Federated Select, structured keys): TFF's
  tag-prediction preprocessing (normalized bag of words over the n most
  frequent words, multi-hot over the 500 most frequent tags) and TFF's
  one-vs-rest logistic regression (one sigmoid `dense` layer, summed binary
  cross-entropy), recall@5.

With synthetic data the vocabularies are TFF's synthetic counts padded with
unused placeholder words/tags to the flag sizes, so the model's shape (and
thus parameter counts and bytes) is that of the real task.
"""

import collections
import json
import os
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tasks import data_utils
from tasks import registry

_SQLITE = 'stackoverflow.sqlite'
_so = tff.simulation.datasets.stackoverflow
_word_pre = tff.simulation.baselines.stackoverflow.word_prediction_preprocessing
_tag_pre = tff.simulation.baselines.stackoverflow.tag_prediction_preprocessing
_keras_metrics = tff.simulation.baselines.keras_metrics


# ----------------------------------------------------------------------------
# Data.
def _error(what: str, cache_dir: Optional[str], e: Exception) -> registry.TaskError:
  return registry.TaskError(
      f"TFF's Stack Overflow {what} could not be loaded (not in "
      f"--cache_dir={cache_dir!r} and no download: {type(e).__name__}: {e}). "
      f'Put {_SQLITE}, stackoverflow.word_count and stackoverflow.tag_count '
      "(from TFF's storage.googleapis.com/tff-datasets-public) in --cache_dir, "
      'or use ' + registry.synthetic_hint(3))


def load_stackoverflow(data_source: str, cache_dir: Optional[str]):
  """(train, test, source); synthetic only when asked for by name."""
  if data_source == 'synthetic':
    data = _so.get_synthetic()
    return data, data, 'synthetic'
  try:
    train, _, test = _so.load_data(cache_dir=cache_dir)
  except Exception as e:  # pylint: disable=broad-except  (network errors vary)
    raise _error('database', cache_dir, e) from e
  return train, test, 'tff'


def _load_counts(kind: str, data_source: str, cache_dir: Optional[str]):
  """Ordered {word or tag: count}, most frequent first."""
  if data_source == 'synthetic':
    return (_so.get_synthetic_word_counts() if kind == 'word'
            else _so.get_synthetic_tag_counts())
  # An already extracted counts file in the cache dir is used as is (TFF's
  # loaders would otherwise look for the .tar.bz2 under <cache_dir>/datasets).
  for folder in filter(None, (cache_dir, cache_dir and os.path.join(cache_dir, 'datasets'))):
    path = os.path.join(folder, f'stackoverflow.{kind}_count')
    if not os.path.exists(path):
      continue
    with open(path) as f:
      if kind == 'tag':  # json {tag: count}, ordered by count as TFF does
        counts = json.load(f)
        return collections.OrderedDict(
            sorted(counts.items(), key=lambda kv: kv[1], reverse=True))
      counts = collections.OrderedDict()
      for line in f:  # "word count" lines, most frequent first
        word, count = line.split()
        counts[word] = int(count)
      return counts
  try:
    if kind == 'word':
      return _so.load_word_counts(cache_dir=cache_dir)
    return _so.load_tag_counts(cache_dir=cache_dir)
  except Exception as e:  # pylint: disable=broad-except
    raise _error(f'{kind} counts', cache_dir, e) from e


def _vocab(kind, size, data_source, cache_dir) -> list[str]:
  vocab = list(_load_counts(kind, data_source, cache_dir))[:size]
  return vocab + [f'<unused_{kind}{i}>' for i in range(size - len(vocab))]


# ----------------------------------------------------------------------------
# Next-word prediction: transformer.
class PositionEmbedding(tf.keras.layers.Layer):
  """Adds a learned embedding of each position (Keras has no such layer)."""

  def __init__(self, sequence_length: int, **kwargs):
    super().__init__(**kwargs)
    self.sequence_length = sequence_length

  def build(self, input_shape):
    self.embeddings = self.add_weight(
        name='embeddings', shape=(self.sequence_length, int(input_shape[-1])),
        initializer=tf.keras.initializers.RandomUniform(-0.05, 0.05))
    super().build(input_shape)

  def call(self, inputs):
    return inputs + self.embeddings[:tf.shape(inputs)[1]]

  def get_config(self):
    return {**super().get_config(), 'sequence_length': self.sequence_length}


class TiedEmbedding(tf.keras.layers.Embedding):
  """An embedding whose matrix is also the output layer (tied weights).

  Called on token ids it looks them up, as `Embedding` does; called with
  `logits=True` on hidden states h it returns `h @ embeddings^T +
  output_bias`, the output softmax's logits over the same vocabulary (Press &
  Wolf 2017; Keras has no tied output layer). The one layer, called twice, holds
  the one shared `[V, d]` matrix and the `[V]` output bias, so that Keras'
  `clone_model` (federated select narrows the vocabulary) keeps input and
  output tied, and every parameter count and byte count sees the matrix once.
  """

  def __init__(self, input_dim, output_dim, output_bias_initializer='zeros', **kwargs):
    super().__init__(input_dim, output_dim, **kwargs)
    self.output_bias_initializer = tf.keras.initializers.get(output_bias_initializer)

  def build(self, input_shape=None):
    super().build(input_shape)
    self.output_bias = self.add_weight(
        name='output_bias', shape=(self.input_dim,),
        initializer=self.output_bias_initializer)

  def call(self, inputs, logits=False):  # pylint: disable=arguments-differ
    if not logits:
      return super().call(inputs)
    return tf.einsum('...d,vd->...v', inputs, self.embeddings) + self.output_bias

  def get_config(self):
    return {**super().get_config(), 'output_bias_initializer':
            tf.keras.initializers.serialize(self.output_bias_initializer)}


def create_transformer(vocab_size: int, sequence_length: int = 20, num_layers: int = 3,
                       embed_dim: int = 96, num_heads: int = 8, ffn_dim: int = 2048,
                       dropout: float = 0.1, tie_embeddings: bool = True) -> tf.keras.Model:
  """Causal transformer encoder over the extended vocabulary (+4 special tokens).

  `tie_embeddings`: the output logits reuse the input embedding matrix
  (`TiedEmbedding`; one layer `embedding`, with an output bias, and no layer
  `output`): 2,271,284 parameters at the default sizes, the model behind
  FedPT's trainable fractions (Table 3: 91.3 / 82.6 / 73.8% with 1 / 2 / 3
  `ffn1` frozen). False: a separate output `Dense` layer named `output`
  (3,231,668 parameters), "a final dense layer with n output units" as
  Federated Select (sec. 5.4) describes its transformer.
  """
  if embed_dim % num_heads:
    raise registry.TaskError(
        f'--stackoverflow_nwp_embed_dim={embed_dim} must be a multiple of '
        f'--stackoverflow_nwp_num_heads={num_heads}')
  extended = vocab_size + 4
  inputs = tf.keras.layers.Input(shape=(sequence_length,), dtype=tf.int64, name='words')
  if tie_embeddings:
    embedding = TiedEmbedding(extended, embed_dim, name='embedding')
  else:
    embedding = tf.keras.layers.Embedding(extended, embed_dim, name='embedding')
  x = embedding(inputs)
  x = PositionEmbedding(sequence_length, name='position_embedding')(x)
  x = tf.keras.layers.Dropout(dropout, name='embedding_dropout')(x)
  for i in range(1, num_layers + 1):
    attention = tf.keras.layers.MultiHeadAttention(
        num_heads, key_dim=embed_dim // num_heads, dropout=dropout,
        name=f'encoder{i}_attention')(x, x, use_causal_mask=True)
    attention = tf.keras.layers.Dropout(dropout, name=f'encoder{i}_dropout1')(attention)
    x = tf.keras.layers.Add(name=f'encoder{i}_add1')([x, attention])
    x = tf.keras.layers.LayerNormalization(epsilon=1e-6, name=f'encoder{i}_norm1')(x)
    h = tf.keras.layers.Dense(ffn_dim, activation='relu', name=f'encoder{i}_ffn1')(x)
    h = tf.keras.layers.Dense(embed_dim, name=f'encoder{i}_ffn2')(h)
    h = tf.keras.layers.Dropout(dropout, name=f'encoder{i}_dropout2')(h)
    x = tf.keras.layers.Add(name=f'encoder{i}_add2')([x, h])
    x = tf.keras.layers.LayerNormalization(epsilon=1e-6, name=f'encoder{i}_norm2')(x)
  if tie_embeddings:
    outputs = embedding(x, logits=True)
  else:
    outputs = tf.keras.layers.Dense(extended, name='output')(x)
  return tf.keras.Model(inputs, outputs, name='stackoverflow_transformer')


def _check_nwp_hparams(*, dropout, **positive) -> None:
  registry.check_positive_hparams('stackoverflow_nwp', **positive)
  if not 0 <= dropout < 1:
    raise registry.TaskError(f'--stackoverflow_nwp_dropout={dropout} must be in [0, 1)')


def nwp_model_from_hparams(*, vocab_size, sequence_length, max_sentences_per_client,
                           num_layers, embed_dim, num_heads, ffn_dim, dropout,
                           tie_embeddings) -> tf.keras.Model:
  """The registry's `model_fn` for `stackoverflow_nwp`: its transformer, reading no data."""
  _check_nwp_hparams(vocab_size=vocab_size, sequence_length=sequence_length,
                     max_sentences_per_client=max_sentences_per_client,
                     num_layers=num_layers, embed_dim=embed_dim, num_heads=num_heads,
                     ffn_dim=ffn_dim, dropout=dropout)
  return create_transformer(vocab_size, sequence_length, num_layers, embed_dim,
                            num_heads, ffn_dim, dropout, tie_embeddings)


def create_nwp_task(*, train_client_spec, eval_client_spec, data_source, data_dir,
                    cache_dir, seed, vocab_size, sequence_length,
                    max_sentences_per_client, num_layers, embed_dim, num_heads,
                    ffn_dim, dropout, tie_embeddings) -> registry.Task:
  """`stackoverflow_nwp` (see module docstring)."""
  del data_dir, seed  # TFF's format only; natural split by user
  _check_nwp_hparams(vocab_size=vocab_size, sequence_length=sequence_length,
                     max_sentences_per_client=max_sentences_per_client,
                     num_layers=num_layers, embed_dim=embed_dim, num_heads=num_heads,
                     ffn_dim=ffn_dim, dropout=dropout)
  train, test, source = load_stackoverflow(data_source, cache_dir)
  vocab = _vocab('word', vocab_size, source, cache_dir)
  special = _word_pre.get_special_tokens(vocab_size, num_out_of_vocab_buckets=1)
  tff_train_fn = _word_pre.create_preprocess_fn(train_client_spec, vocab, sequence_length)

  def train_preprocess_fn(dataset):
    # At most `max_sentences_per_client` sentences, then TFF's epochs/batching.
    return tff_train_fn(dataset.take(max_sentences_per_client))

  def keras_model_fn():
    return create_transformer(vocab_size, sequence_length, num_layers, embed_dim,
                              num_heads, ffn_dim, dropout, tie_embeddings)

  def metrics_fn():
    return [_keras_metrics.MaskedCategoricalAccuracy(
        name='accuracy',
        masked_tokens=[special.padding, special.end_of_sentence] + special.out_of_vocab)]

  baseline = registry.make_baseline_task(
      train_data=train,
      test_data=test,
      train_preprocess_fn=train_preprocess_fn,
      eval_preprocess_fn=_word_pre.create_preprocess_fn(eval_client_spec, vocab, sequence_length),
      keras_model_fn=keras_model_fn,
      loss_fn=data_utils.padding_ignoring_loss,
      metrics_fn=metrics_fn,
  )
  return registry.Task(
      name='stackoverflow_nwp', baseline=baseline, keras_model_fn=keras_model_fn,
      loss_fn=data_utils.padding_ignoring_loss, metrics_fn=metrics_fn, data_source=source,
      oov_token=special.out_of_vocab[0],
      data_description=(
          f'Stack Overflow next-word prediction from {source}: '
          f'{len(train.client_ids)} train users, vocabulary {vocab_size}, length '
          f'{sequence_length}, <= {max_sentences_per_client} sentences per client'
          + (' (SYNTHETIC: TFF get_synthetic, vocabulary padded with placeholders)'
             if source == 'synthetic' else '')))


# ----------------------------------------------------------------------------
# Tag prediction: one-vs-rest logistic regression.
def create_logistic_regression(vocab_size: int, num_tags: int) -> tf.keras.Model:
  """TFF's tag-prediction model: one sigmoid dense layer, named `dense`."""
  return tf.keras.Sequential([
      tf.keras.layers.Input(shape=(vocab_size,), name='bag_of_words'),
      tf.keras.layers.Dense(num_tags, activation='sigmoid', name='dense'),
  ], name='stackoverflow_tags_lr')


def _tags_loss():
  return tf.keras.losses.BinaryCrossentropy(
      from_logits=False, reduction=tf.keras.losses.Reduction.SUM)


def _tags_metrics():
  return [tf.keras.metrics.Precision(name='precision'),
          tf.keras.metrics.Recall(top_k=5, name='recall_at_5')]


def tags_model_from_hparams(*, vocab_size, num_tags) -> tf.keras.Model:
  """The registry's `model_fn` for `stackoverflow_tags`: its model, reading no data."""
  registry.check_positive_hparams('stackoverflow_tags', vocab_size=vocab_size,
                                  num_tags=num_tags)
  return create_logistic_regression(vocab_size, num_tags)


def create_tags_task(*, train_client_spec, eval_client_spec, data_source, data_dir,
                     cache_dir, seed, vocab_size, num_tags) -> registry.Task:
  """`stackoverflow_tags` (see module docstring)."""
  del data_dir, seed
  registry.check_positive_hparams('stackoverflow_tags', vocab_size=vocab_size,
                                  num_tags=num_tags)
  train, test, source = load_stackoverflow(data_source, cache_dir)
  word_vocab = _vocab('word', vocab_size, source, cache_dir)
  tag_vocab = _vocab('tag', num_tags, source, cache_dir)

  def keras_model_fn():
    return create_logistic_regression(vocab_size, num_tags)

  baseline = registry.make_baseline_task(
      train_data=train,
      test_data=test,
      train_preprocess_fn=_tag_pre.create_preprocess_fn(train_client_spec, word_vocab, tag_vocab),
      eval_preprocess_fn=_tag_pre.create_preprocess_fn(eval_client_spec, word_vocab, tag_vocab),
      keras_model_fn=keras_model_fn,
      loss_fn=_tags_loss,
      metrics_fn=_tags_metrics,
  )
  return registry.Task(
      name='stackoverflow_tags', baseline=baseline, keras_model_fn=keras_model_fn,
      loss_fn=_tags_loss, metrics_fn=_tags_metrics, data_source=source,
      data_description=(
          f'Stack Overflow tag prediction from {source}: {len(train.client_ids)} '
          f'train users, bag of {vocab_size} words, {num_tags} tags'
          + (' (SYNTHETIC: TFF get_synthetic, vocabularies padded with placeholders)'
             if source == 'synthetic' else '')))


_SOURCES = ('auto', 'tff', 'synthetic')
registry.register_task(
    'stackoverflow_nwp', create_nwp_task, flag_prefix='stackoverflow_nwp',
    hparams=collections.OrderedDict(
        vocab_size=10000, sequence_length=20, max_sentences_per_client=256,
        num_layers=3, embed_dim=96, num_heads=8, ffn_dim=2048, dropout=0.1,
        tie_embeddings=True),
    hparam_help={
        'vocab_size': 'most frequent words in the vocabulary',
        'sequence_length': 'words per sentence (padded/truncated)',
        'max_sentences_per_client': 'training sentences per client per round',
        'num_layers': 'transformer encoder blocks (encoder1, encoder2, ...)',
        'embed_dim': 'model dimension',
        'num_heads': 'attention heads (key dim = embed_dim / num_heads)',
        'ffn_dim': 'hidden units of encoder{i}_ffn1',
        'dropout': 'dropout rate',
        'tie_embeddings': (
            'output logits reuse the input embedding matrix (FedPT\'s model, '
            '2.27M parameters; layer `embedding` only); false: a separate '
            '`output` Dense layer (3.23M, Federated Select\'s description)'),
    },
    data_sources=_SOURCES,
    description='Stack Overflow next-word prediction, 3-layer transformer (FedPT, select)',
    model_fn=nwp_model_from_hparams)
registry.register_task(
    'stackoverflow_tags', create_tags_task, flag_prefix='stackoverflow_tags',
    hparams=collections.OrderedDict(vocab_size=10000, num_tags=500),
    hparam_help={
        'vocab_size': 'most frequent words in the bag of words',
        'num_tags': 'most frequent tags predicted',
    },
    data_sources=_SOURCES,
    description='Stack Overflow tag prediction, logistic regression (select)',
    model_fn=tags_model_from_hparams)
