"""Small stand-in Keras models for the federated select tests.

`word_model` has the shape of shakespeare_word / stackoverflow_nwp (embedding,
inner dense FFN, output dense over the vocabulary) and `bag_of_words` that of
stackoverflow_tags (one dense layer over a bag of words); those tasks are
written on another branch.
"""

import numpy as np
import tensorflow as tf


def cnn():
  """conv_a (2) -> conv_b (4 filters, the selected layer) -> pool -> dense."""
  return tf.keras.Sequential([
      tf.keras.layers.Input(shape=(6, 6, 1)),
      tf.keras.layers.Conv2D(2, 3, padding='same', activation='relu', name='conv_a'),
      tf.keras.layers.Conv2D(4, 3, padding='same', activation='relu', name='conv_b'),
      tf.keras.layers.MaxPool2D(2, name='pool'),
      tf.keras.layers.Flatten(name='flatten'),
      tf.keras.layers.Dense(5, activation='relu', name='dense'),
      tf.keras.layers.Dense(3, name='out'),
  ])


def cnn_gn():
  return tf.keras.Sequential([
      tf.keras.layers.Input(shape=(4, 4, 1)),
      tf.keras.layers.Conv2D(4, 3, padding='same', name='conv_b'),
      tf.keras.layers.GroupNormalization(groups=2, name='group_norm'),
      tf.keras.layers.Conv2D(3, 3, padding='same', name='conv_c'),
      tf.keras.layers.Flatten(name='flatten'),
      tf.keras.layers.Dense(2, name='out'),
  ])


def mlp():
  return tf.keras.Sequential([
      tf.keras.layers.Input(shape=(7,)),
      tf.keras.layers.Dense(6, activation='relu', name='dense1'),
      tf.keras.layers.Dense(4, activation='relu', name='dense2'),
      tf.keras.layers.Dense(3, name='dense3'),
  ])


def word_model(vocab=10):
  """Stand-in of shakespeare_word / stackoverflow_nwp: embedding ... output."""
  tokens = tf.keras.Input(shape=(5,), dtype=tf.int32)
  h = tf.keras.layers.Embedding(vocab, 4, name='embedding')(tokens)
  h = tf.keras.layers.Dense(6, activation='relu', name='ffn1')(h)
  h = tf.keras.layers.Dense(4, name='ffn2')(h)
  out = tf.keras.layers.Dense(vocab, name='output')(h)
  return tf.keras.Model(tokens, out, name='word_model')


def bag_of_words(n=12, tags=5):
  """Stand-in of stackoverflow_tags: one dense layer over a bag of words."""
  return tf.keras.Sequential([
      tf.keras.layers.Input(shape=(n,)),
      tf.keras.layers.Dense(tags, activation='sigmoid', name='dense'),
  ], name='tags_model')


def randomize(model, seed=0):
  rng = np.random.default_rng(seed)
  model.set_weights([rng.normal(size=w.shape).astype(np.float32)
                     for w in model.get_weights()])
  return model
