"""Variable typing of PVT (tff_partial/masks/variable_types.py)."""

import importlib

import tensorflow as tf

from tasks import emnist
from tff_partial.masks import variable_types as vt

A = vt.ADDITIVE_VECTOR
V = vt.MULTIPLICATIVE_VECTOR
M = vt.MULTIPLICATIVE_MATRIX


def _resnet_block_model():
  """ResNet-18-GN's layer kinds: bias-free convs, GroupNorm, residual, dense."""
  inputs = tf.keras.Input((8, 8, 3))
  x = tf.keras.layers.Conv2D(4, 3, padding='same', use_bias=False, name='conv1')(inputs)
  x = tf.keras.layers.GroupNormalization(groups=2, name='gn1')(x)
  y = tf.keras.layers.Conv2D(4, 3, padding='same', use_bias=False, name='conv2')(x)
  y = tf.keras.layers.GroupNormalization(groups=2, name='gn2')(y)
  x = tf.keras.layers.Add()([x, y])
  x = tf.keras.layers.GlobalAveragePooling2D()(x)
  outputs = tf.keras.layers.Dense(10, name='fc')(x)
  return tf.keras.Model(inputs, outputs)


def _transformer_model():
  """The transformer's layer kinds: Embedding, MHA, LayerNorm, FFN."""
  tokens = tf.keras.Input((5,), dtype=tf.int32)
  x = tf.keras.layers.Embedding(20, 8, name='embedding')(tokens)
  attention = tf.keras.layers.MultiHeadAttention(2, 4, name='mha')(x, x)
  x = tf.keras.layers.LayerNormalization(name='ln1')(x + attention)
  h = tf.keras.layers.Dense(16, activation='relu', name='ffn1')(x)
  h = tf.keras.layers.Dense(8, name='ffn2')(h)
  x = tf.keras.layers.LayerNormalization(name='ln2')(x + h)
  outputs = tf.keras.layers.Dense(20, name='logits')(x)
  return tf.keras.Model(tokens, outputs)


class _Custom(tf.keras.layers.Layer):
  """A layer kind the role table does not know, with a variable named kernel."""

  def build(self, input_shape):
    self.kernel = self.add_weight('kernel', shape=(input_shape[-1], 2))

  def call(self, x):
    return tf.matmul(x, self.kernel)


class VariableTypesTest(tf.test.TestCase):

  def test_emnist_cnn(self):
    model = emnist.create_cnn()
    self.assertEqual(vt.classify_variables(model), [M, A, M, A, M, A, M, A])

  def test_emnist_cnn_gn(self):
    model = emnist.create_cnn(group_norm=True)
    names = [v.name for v in model.trainable_weights]
    self.assertEqual(names[4:6], ['group_norm/gamma:0', 'group_norm/beta:0'])
    self.assertEqual(vt.classify_variables(model), [M, A, M, A, V, A, M, A, M, A])

  def test_emnist_2nn(self):
    self.assertEqual(vt.classify_variables(emnist.create_2nn()), [M, A] * 3)

  def test_resnet_gn_kinds(self):
    model = _resnet_block_model()
    self.assertEqual(vt.classify_variables(model), [M, V, A, M, V, A, M, A])

  def test_transformer_kinds(self):
    model = _transformer_model()
    described = {name: t for name, _, t, _ in vt.describe(model)}
    expected = {
        'embedding/embeddings:0': M,
        'mha/query/kernel:0': M, 'mha/query/bias:0': A,
        'mha/key/kernel:0': M, 'mha/key/bias:0': A,
        'mha/value/kernel:0': M, 'mha/value/bias:0': A,
        'mha/attention_output/kernel:0': M, 'mha/attention_output/bias:0': A,
        'ln1/gamma:0': V, 'ln1/beta:0': A,
        'ffn1/kernel:0': M, 'ffn1/bias:0': A,
        'ffn2/kernel:0': M, 'ffn2/bias:0': A,
        'ln2/gamma:0': V, 'ln2/beta:0': A,
        'logits/kernel:0': M, 'logits/bias:0': A,
    }
    self.assertEqual(described, {k: v.value for k, v in expected.items()})
    # Aligned with trainable_weights, i.e. with TFF's ModelWeights.trainable.
    types = vt.classify_variables(model)
    self.assertEqual(
        types, [expected[v.name] for v in model.trainable_weights])
    # The MHA's kernels are rank 3 and its query bias is rank 2: typing is by
    # role, not by rank.
    shapes = {name: shape for name, _, _, shape in vt.describe(model)}
    self.assertEqual(shapes['mha/query/kernel:0'], (8, 2, 4))
    self.assertEqual(shapes['mha/query/bias:0'], (2, 4))

  def test_recurrent_kernels(self):
    inputs = tf.keras.Input((3, 4))
    outputs = tf.keras.layers.LSTM(5, name='lstm')(inputs)
    model = tf.keras.Model(inputs, outputs)
    self.assertEqual(vt.classify_variables(model), [M, M, A])

  def test_by_role_not_name(self):
    # A variable called `kernel` in a layer kind the table does not know is
    # not guessed from its name.
    inputs = tf.keras.Input((3,))
    model = tf.keras.Model(inputs, _Custom(name='custom')(inputs))
    with self.assertRaisesRegex(ValueError, 'custom/kernel:0'):
      vt.classify_variables(model)
    self.assertEqual(
        vt.classify_variables(model, overrides={'custom/kernel:0': M}), [M])
    # A Dense layer whose name looks like a normalization offset is a Dense.
    model = tf.keras.Sequential(
        [tf.keras.Input((3,)), tf.keras.layers.Dense(2, name='beta')])
    self.assertEqual(vt.classify_variables(model), [M, A])

  def test_real_resnet18_gn_if_present(self):
    try:
      cifar10 = importlib.import_module('tasks.cifar10')
    except ModuleNotFoundError:
      self.skipTest('tasks/cifar10.py is not on this branch yet')
    model = cifar10.create_resnet18_gn(width=4, num_classes=10)
    types = vt.classify_variables(model)
    # 1 stem conv + 8 blocks x 2 convs + 3 shortcut convs, each with a
    # GroupNorm (gamma, beta); bias-free convs; one dense head.
    self.assertEqual(types.count(M), 20 + 1)
    self.assertEqual(types.count(V), 20)
    self.assertEqual(types.count(A), 20 + 1)
    for v, t in zip(model.trainable_weights, types):
      if '_gn' in v.name:
        self.assertIn(t, (V, A))

  def test_real_transformer_if_present(self):
    try:
      stackoverflow = importlib.import_module('tasks.stackoverflow')
    except ModuleNotFoundError:
      self.skipTest('tasks/stackoverflow.py is not on this branch yet')
    from scripts.methods import pvt  # pylint: disable=g-import-not-at-top
    pvt.register_task_layers()
    body = [
        ('PositionEmbedding.embeddings', A.value),
        ('EinsumDense.kernel', M.value), ('EinsumDense.bias', A.value),
        ('EinsumDense.kernel', M.value), ('EinsumDense.bias', A.value),
        ('EinsumDense.kernel', M.value), ('EinsumDense.bias', A.value),
        ('EinsumDense.kernel', M.value), ('EinsumDense.bias', A.value),
        ('LayerNormalization.gamma', V.value), ('LayerNormalization.beta', A.value),
        ('Dense.kernel', M.value), ('Dense.bias', A.value),
        ('Dense.kernel', M.value), ('Dense.bias', A.value),
        ('LayerNormalization.gamma', V.value), ('LayerNormalization.beta', A.value),
    ]
    # Tied (the default, the paper's model): the output reuses the embedding
    # matrix and adds its own bias; untied: a separate output Dense.
    for tie, head, tail in (
        (True, [('TiedEmbedding.embeddings', M.value), ('TiedEmbedding.output_bias', A.value)],
         []),
        (False, [('Embedding.embeddings', M.value)],
         [('Dense.kernel', M.value), ('Dense.bias', A.value)])):
      model = stackoverflow.create_transformer(
          vocab_size=10, num_layers=1, embed_dim=8, num_heads=2, ffn_dim=16, dropout=0.0,
          tie_embeddings=tie)
      described = [(layer_attr, t) for _, layer_attr, t, _ in vt.describe(model)]
      self.assertEqual(described, head + body + tail, f'tie_embeddings={tie}')

  def test_register_layer_roles(self):
    inputs = tf.keras.Input((3,))
    model = tf.keras.Model(inputs, _Custom(name='custom2')(inputs))
    vt.register_layer_roles(_Custom, {'kernel': V})
    try:
      self.assertEqual(vt.classify_variables(model), [V])
    finally:
      vt._CUSTOM_ROLES.clear()  # pylint: disable=protected-access

  def test_freezable_indices(self):
    types = vt.classify_variables(emnist.create_cnn(group_norm=True))
    self.assertEqual(vt.freezable_indices(types), [0, 2, 4, 6, 8])
    self.assertEqual(vt.freezable_indices(types, [M]), [0, 2, 6, 8])


if __name__ == '__main__':
  tf.test.main()
