"""Tests of tff_partial/select/slicing.py: psi/phi and coupled slices."""

import collections

import numpy as np
import tensorflow as tf

from tasks import emnist
from tasks import stackoverflow
from tff_partial.select import keys as keys_lib
from tff_partial.select import slicing
from tests.select_test_utils import bag_of_words, cnn, cnn_gn, mlp, randomize, word_model


def sub_model(fn, spec, full, keys):
  sub = slicing.build_client_keras_model(fn, spec)
  sub_trainable = slicing.select_sub_model(
      spec, [w.numpy() for w in full.trainable_weights], keys)
  sub.set_weights([np.asarray(w) for w in sub_trainable])
  return sub


def cnn_with_conv_b_filters_dropped(full, drop, next_scale=1.0):
  """`cnn()` with `full`'s weights, conv_b filters `drop` zeroed (kernel and
  bias) and the next dense kernel's matching rows zeroed, the rest of that
  kernel scaled by `next_scale`."""
  zeroed = [w.numpy().copy() for w in full.weights]
  zeroed[2][..., drop] = 0.0
  zeroed[3][drop] = 0.0
  k = zeroed[4].reshape(9, 4, 5)
  k[:, drop, :] = 0.0
  zeroed[4] = next_scale * k.reshape(36, 5)
  masked = cnn()
  masked.set_weights(zeroed)
  return masked


class SliceShapesAndValuesTest(tf.test.TestCase):

  def test_conv_filters_couple_next_dense_rows_after_flatten(self):
    full = randomize(cnn())
    spec = slicing.make_select_spec(
        full, [slicing.GroupConfig(['conv_b'], 2, structured=False)])
    (group,) = spec.groups
    self.assertEqual([s.name for s in group.slices],
                     ['conv_b/kernel:0', 'conv_b/bias:0', 'dense/kernel:0'])
    keys = {'conv_b': np.array([2, 0], np.int32)}
    sub = slicing.select_sub_model(spec, [w.numpy() for w in full.trainable_weights], keys)
    kernel_b, bias_b, dense_kernel = (w.numpy() for w in full.trainable_weights[2:5])
    self.assertEqual(sub[2].shape, (3, 3, 2, 2))
    self.assertAllEqual(sub[2], kernel_b[:, :, :, [2, 0]])
    self.assertAllEqual(sub[3], bias_b[[2, 0]])
    # pool output is (3, 3, 4): flattened row of (h, w, c) is h*12 + w*4 + c.
    rows = [h * 12 + w * 4 + c for h in range(3) for w in range(3) for c in (2, 0)]
    self.assertEqual(sub[4].shape, (18, 5))
    self.assertAllEqual(sub[4], dense_kernel[rows])
    # Everything else is broadcast unchanged.
    for i in spec.broadcast_indices:
      self.assertAllEqual(sub[i], full.trainable_weights[i].numpy())
    self.assertEqual(spec.broadcast_indices, (0, 1, 5, 6, 7))

  def test_conv_sub_model_equals_full_model_with_other_filters_zeroed(self):
    full = randomize(cnn(), seed=1)
    spec = slicing.make_select_spec(
        full, [slicing.GroupConfig(['conv_b'], 2, structured=False)])
    keys = {'conv_b': np.array([1, 3], np.int32)}
    sub = sub_model(cnn, spec, full, keys)
    x = np.random.default_rng(2).random((3, 6, 6, 1)).astype(np.float32)
    masked = cnn_with_conv_b_filters_dropped(full, drop=[0, 2])
    self.assertAllClose(sub(x), masked(x), atol=1e-5)

  def test_conv_filters_with_group_norm_and_next_conv(self):
    full = randomize(cnn_gn())
    spec = slicing.make_select_spec(
        full, [slicing.GroupConfig(['conv_b'], 2, structured=False)])
    (group,) = spec.groups
    self.assertEqual([s.name for s in group.slices],
                     ['conv_b/kernel:0', 'conv_b/bias:0', 'group_norm/gamma:0',
                      'group_norm/beta:0', 'conv_c/kernel:0'])
    keys = {'conv_b': np.array([3, 1], np.int32)}
    sub = slicing.select_sub_model(spec, [w.numpy() for w in full.trainable_weights], keys)
    w = [v.numpy() for v in full.trainable_weights]
    self.assertAllEqual(sub[0], w[0][..., [3, 1]])
    self.assertAllEqual(sub[2], w[2][[3, 1]])
    self.assertAllEqual(sub[3], w[3][[3, 1]])
    self.assertEqual(sub[4].shape, (3, 3, 2, 3))
    self.assertAllEqual(sub[4], w[4][:, :, [3, 1], :])
    client = slicing.build_client_keras_model(cnn_gn, spec)
    self.assertEqual(client.get_layer('group_norm').groups, 2)
    self.assertEqual([tuple(v.shape) for v in client.trainable_weights],
                     [tuple(np.shape(s)) for s in sub])

  def test_dense_units_couple_next_kernel_rows(self):
    full = randomize(mlp())
    spec = slicing.make_select_spec(
        full, [slicing.GroupConfig(['dense1'], 3, structured=False)])
    keys = {'dense1': np.array([5, 1, 3], np.int32)}
    sub = slicing.select_sub_model(spec, [w.numpy() for w in full.trainable_weights], keys)
    w = [v.numpy() for v in full.trainable_weights]
    self.assertAllEqual(sub[0], w[0][:, [5, 1, 3]])
    self.assertAllEqual(sub[1], w[1][[5, 1, 3]])
    self.assertAllEqual(sub[2], w[2][[5, 1, 3], :])
    self.assertEqual(spec.broadcast_indices, (3, 4, 5))
    client = sub_model(mlp, spec, full, keys)
    x = np.random.default_rng(3).random((4, 7)).astype(np.float32)
    zeroed = [v.copy() for v in w]
    zeroed[0][:, [0, 2, 4]] = 0
    zeroed[1][[0, 2, 4]] = 0
    zeroed[2][[0, 2, 4], :] = 0
    masked = mlp()
    masked.set_weights(zeroed)
    self.assertAllClose(client(x), masked(x), atol=1e-6)

  def test_rescaled_filters_equal_dropout_with_inverse_scaling(self):
    # --select_rescale: m=2 of K=4 filters, activations times K/m = 2, i.e.
    # the full model with the other filters zeroed and the next rows doubled.
    full = randomize(cnn(), seed=1)
    configs = slicing.group_configs(full, ['conv_b'], 2, 'random', rescale=True)
    self.assertEqual(configs[0].output_scale, 2.0)
    spec = slicing.make_select_spec(full, configs)
    keys = {'conv_b': np.array([1, 3], np.int32)}
    sub = sub_model(cnn, spec, full, keys)
    x = np.random.default_rng(2).random((3, 6, 6, 1)).astype(np.float32)
    masked = cnn_with_conv_b_filters_dropped(full, drop=[0, 2], next_scale=2.0)
    self.assertAllClose(sub(x), masked(x), atol=1e-4)
    # m = K: scale 1, the sub-model is the full model.
    self.assertEqual(
        slicing.group_configs(full, ['conv_b'], 4, 'random', rescale=True)[0].output_scale, 1.0)

  def test_rescale_is_skipped_after_normalization_and_refused_explicitly(self):
    model = cnn_gn()
    configs = slicing.group_configs(model, ['conv_b'], 2, 'random', rescale=True)
    self.assertEqual(configs[0].output_scale, 1.0)
    with self.assertRaisesRegex(ValueError, '--select_rescale.*group_norm|normalization'):
      slicing.make_select_spec(
          model, [slicing.GroupConfig(['conv_b'], 2, structured=False, output_scale=2.0)])

  def test_embedding_and_output_share_vocabulary_keys(self):
    full = randomize(word_model())
    spec = slicing.make_select_spec(
        full, [slicing.GroupConfig(['embedding', 'output'], 4, structured=True)])
    (group,) = spec.groups
    self.assertEqual(group.kind, 'outputs+rows')
    self.assertEqual(group.input_role, 'tokens')
    self.assertEqual(group.output_role, 'classes')
    keys = {'embedding': np.array([1, 4, 6, 8], np.int32)}
    client = sub_model(word_model, spec, full, keys)
    tokens = np.array([[1, 4, 6, 8, 4], [8, 8, 1, 6, 4]], np.int32)
    batch = slicing.remap_batch(spec, keys, (tf.constant(tokens), tf.constant(tokens)))
    self.assertAllEqual(batch[0], [[0, 1, 2, 3, 1], [3, 3, 0, 2, 1]])
    # The client's logits are the full model's logits of its selected words.
    self.assertAllClose(client(batch[0]), tf.gather(full(tokens), [1, 4, 6, 8], axis=-1),
                        atol=1e-5)

  def test_bucketed_keys_select_blocks_of_rows(self):
    full = randomize(word_model(vocab=12))
    spec = slicing.make_select_spec(full, [slicing.GroupConfig(
        ['embedding', 'output'], 2, structured=True, bucket_size=3, oov_index=0)])
    (group,) = spec.groups
    self.assertEqual(group.num_keys, 4)
    keys = {'embedding': np.array([0, 3], np.int32)}  # rows 0,1,2 and 9,10,11
    sub = slicing.select_sub_model(spec, [w.numpy() for w in full.trainable_weights], keys)
    emb = full.get_layer('embedding').embeddings.numpy()
    self.assertAllEqual(sub[0], emb[[0, 1, 2, 9, 10, 11]])
    out_kernel = full.get_layer('output').kernel.numpy()
    self.assertAllEqual(sub[5], out_kernel[:, [0, 1, 2, 9, 10, 11]])
    # Tokens outside the keys go to the OOV index 0 (local 0).
    local = slicing.local_indices(group, keys['embedding'], tf.constant([10, 5, 2]))
    self.assertAllEqual(local, [4, 0, 2])

  def test_bag_of_words_rows(self):
    full = randomize(bag_of_words())
    spec = slicing.make_select_spec(
        full, [slicing.GroupConfig(['dense'], 3, structured=True)])
    (group,) = spec.groups
    self.assertEqual(group.input_role, 'features')
    self.assertEqual(spec.broadcast_indices, (1,))  # the bias is broadcast
    keys = {'dense': np.array([2, 7, 11], np.int32)}
    client = sub_model(bag_of_words, spec, full, keys)
    x = np.zeros((2, 12), np.float32)
    x[0, [2, 11]] = 1
    x[1, [7]] = 1
    xb, _ = slicing.remap_batch(spec, keys, (tf.constant(x), tf.zeros([2, 5])))
    self.assertAllEqual(xb, [[1, 0, 1], [0, 1, 0]])
    self.assertAllClose(client(xb), full(x), atol=1e-6)

  def test_select_then_deselect_is_identity_on_selected_slices(self):
    cases = ((cnn, 'conv_b', [2, 0, 1], 1), (mlp, 'dense1', [2, 0], 2))
    for fn, layer, keys, bucket in cases:
      full = randomize(fn())
      spec = slicing.make_select_spec(full, [slicing.GroupConfig(
          [layer], len(keys), structured=False, bucket_size=bucket)])
      (group,) = spec.groups
      keys = np.array(keys, np.int32)
      trainable = [w.numpy() for w in full.trainable_weights]
      sub = slicing.select_sub_model(spec, trainable, {layer: keys})
      stacked = slicing.disassemble(spec, group, [sub[s.index] for s in group.slices])
      views, counts = slicing.scatter_to_views(spec, group, keys, stacked)
      self.assertAllEqual(
          counts, np.isin(np.arange(group.num_keys), keys).astype(np.float32))
      back = slicing.views_to_variables(spec, group, views)
      # phi(psi(x, z), z) == x on the selected slices, 0 elsewhere.
      selected_idx = (keys[:, None] * bucket + np.arange(bucket)).reshape(-1)
      for s, b in zip(group.slices, back):
        expect = np.zeros(s.view_shape, np.float32)
        view = trainable[s.index].reshape(s.view_shape)
        index = [slice(None)] * len(s.view_shape)
        index[s.axis] = selected_idx
        expect[tuple(index)] = view[tuple(index)]
        self.assertAllEqual(np.reshape(b, s.view_shape), expect)
      # ... and selecting again from it gives the same sub-model.
      placed = list(trainable)
      for s, b in zip(group.slices, back):
        placed[s.index] = b
      again = slicing.select_sub_model(spec, placed, {layer: keys})
      for s in group.slices:
        self.assertAllEqual(again[s.index], sub[s.index])


class ClientParamsTest(tf.test.TestCase):

  def test_emnist_cnn_conv2_filters(self):
    model = emnist.create_cnn()
    total = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    self.assertEqual(total, 1_690_046)
    for m in (4, 8, 16, 32, 64):
      spec = slicing.make_select_spec(
          model, slicing.group_configs(model, ['conv2'], m, 'random'))
      # conv1 + conv2 (5x5x32 per filter + bias) + dense1 (7*7*m rows of 512,
      # bias) + dense2.
      expected = 832 + (800 * m + m) + (49 * m * 512 + 512) + (512 * 62 + 62)
      self.assertEqual(slicing.client_params(spec), expected)
    self.assertEqual(slicing.client_params(spec), total)

  def test_emnist_2nn_dense1_units(self):
    model = emnist.create_2nn()
    total = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    self.assertEqual(total, 209_662)
    for m in (10, 50, 100, 200):
      spec = slicing.make_select_spec(
          model, slicing.group_configs(model, ['dense1'], m, 'random'))
      expected = 784 * m + m + m * 200 + 200 + 12_462
      self.assertEqual(slicing.client_params(spec), expected)


class ValidationTest(tf.test.TestCase):

  def test_unknown_layer_names_flag_and_valid_layers(self):
    with self.assertRaisesRegex(ValueError, r'--select_layer=.*conv9.*conv1, conv2, dense1, dense2'):
      slicing.group_configs(emnist.create_cnn(), ['conv9'], 4, 'random')

  def test_too_many_keys_names_flag_and_maximum(self):
    model = emnist.create_cnn()
    with self.assertRaisesRegex(ValueError, r'--select_keys=65.*maximum 64'):
      slicing.make_select_spec(model, slicing.group_configs(model, ['conv2'], 65, 'random'))

  def test_structured_policy_on_inner_layer(self):
    with self.assertRaisesRegex(ValueError, '--select_policy=top'):
      slicing.group_configs(emnist.create_cnn(), ['conv2'], 4, 'top')

  def test_mixed_gives_inner_layer_same_fraction(self):
    model = word_model(vocab=10)
    configs = slicing.group_configs(model, ['embedding', 'output', 'ffn1'], 5, 'mixed')
    self.assertEqual([(c.layers, c.keys_per_client, c.structured) for c in configs],
                     [(['embedding', 'output'], 5, True), (['ffn1'], 3, False)])


class KeyPolicyTest(tf.test.TestCase):

  def _spec(self, m):
    model = word_model(vocab=10)
    return slicing.make_select_spec(
        model, slicing.group_configs(model, ['embedding', 'output', 'ffn1'], m, 'mixed'))

  def test_top_random_top_random(self):
    spec = self._spec(3)
    tokens = np.array([[3, 3, 3, 5, 5], [7, 7, 1, 3, 2]], np.int32)
    ds = tf.data.Dataset.from_tensors((tokens, tokens))
    # counts over x and y: 3 -> 8, 7 -> 4, 5 -> 4, 1 -> 2, 2 -> 2.
    keys = keys_lib.KeyPolicy(spec, 'mixed', seed=0).client_keys(0, 'a', ds)
    self.assertAllEqual(keys['embedding'], [3, 5, 7])
    self.assertLen(keys['ffn1'], 2)  # round(3 * 6 / 10)
    self.assertLen(set(keys['ffn1']), 2)
    rt = keys_lib.KeyPolicy(spec, 'random_top', seed=0)
    for r in range(5):
      k = rt.client_keys(r, 'a', ds)['embedding']
      self.assertTrue(set(k) <= {3, 5, 7, 1, 2, 0})  # the 6 most frequent
    # Random keys: stateless in (seed, round, client); same per round if asked.
    rnd = keys_lib.KeyPolicy(spec, 'random', seed=4)
    self.assertAllEqual(rnd.client_keys(2, 'a')['ffn1'], rnd.client_keys(2, 'a')['ffn1'])
    same = keys_lib.KeyPolicy(spec, 'random', seed=4, same_keys_per_round=True)
    self.assertAllEqual(same.client_keys(2, 'a')['embedding'], same.client_keys(2, 'b')['embedding'])
    draws = {tuple(rnd.client_keys(r, c)['embedding']) for r in range(4) for c in 'abc'}
    self.assertGreater(len(draws), 6)

  def test_padding_and_oov_tokens_always_selected(self):
    # shakespeare_word / stackoverflow_nwp: Embedding(mask_zero) and an OOV id.
    tokens = tf.keras.Input(shape=(5,), dtype=tf.int32)
    h = tf.keras.layers.Embedding(10, 4, mask_zero=True, name='embedding')(tokens)
    model = tf.keras.Model(tokens, tf.keras.layers.Dense(10, name='output')(h))
    spec = slicing.make_select_spec(model, slicing.group_configs(
        model, ['embedding', 'output'], 3, 'top', oov_index=9))
    self.assertEqual(spec.groups[0].pad_index, 0)
    tokens = np.array([[3, 3, 3, 5, 5], [7, 7, 1, 3, 2]], np.int32)
    ds = tf.data.Dataset.from_tensors((tokens, tokens))
    keys = keys_lib.KeyPolicy(spec, 'top').client_keys(0, 'a', ds)['embedding']
    self.assertAllEqual(keys, [0, 3, 9])  # pad, the most frequent word, OOV
    # Padding stays local 0 (masked); unselected words -> the OOV's local id.
    local = slicing.local_indices(spec.groups[0], keys, np.array([0, 3, 5, 9]))
    self.assertAllEqual(local, [0, 1, 2, 2])
    for policy in ('random', 'random_top'):
      for r in range(3):
        k = keys_lib.KeyPolicy(spec, policy, seed=1).client_keys(r, 'a', ds)['embedding']
        self.assertLen(k, 3)
        self.assertContainsSubset([0, 9], k.tolist())

  def test_padding_kept_local_zero_for_token_groups_without_mask_zero(self):
    # stackoverflow_nwp's embedding has no mask_zero, and `output` may be
    # selected alone; the word tasks' loss skips label 0, so padding must stay
    # the client's local 0 under every policy.
    model = word_model(vocab=10)
    tokens = np.array([[3, 3, 3, 5, 5], [7, 7, 1, 3, 2]], np.int32)
    ds = tf.data.Dataset.from_tensors((tokens, tokens))
    for layers in (['embedding', 'output'], ['output']):
      spec = slicing.make_select_spec(model, slicing.group_configs(
          model, layers, 3, 'top', oov_index=9))
      group = spec.groups[0]
      self.assertEqual(group.pad_index, 0)
      for policy in ('top', 'random', 'random_top'):
        for r in range(3):
          k = keys_lib.KeyPolicy(spec, policy, seed=2).client_keys(r, 'a', ds)[group.name]
          self.assertContainsSubset([0, 9], k.tolist())
          self.assertEqual(int(slicing.local_indices(group, k, np.array([0]))[0]), 0)
    # Not a token task (no OOV id): no padding key is forced.
    spec = slicing.make_select_spec(model, slicing.group_configs(
        model, ['embedding', 'output'], 3, 'top'))
    self.assertIsNone(spec.groups[0].pad_index)


class TiedEmbeddingTest(tf.test.TestCase):
  """stackoverflow_nwp's tied output: one [V, d] matrix for input and output."""

  def test_shared_matrix_sliced_once_and_sub_model_exact(self):
    def fn():
      return stackoverflow.create_transformer(
          8, sequence_length=5, num_layers=1, embed_dim=4, num_heads=2,
          ffn_dim=6, dropout=0.0)  # 12 tokens: pad 0, words 1..8, OOV 9, BOS, EOS
    full = randomize(fn())
    spec = slicing.make_select_spec(full, slicing.group_configs(
        full, ['embedding'], 5, 'top', oov_index=9))
    (group,) = spec.groups
    self.assertEqual(group.kind, 'outputs+rows')
    self.assertEqual((group.input_role, group.output_role), ('tokens', 'classes'))
    # The shared matrix (index 0) once, and the output bias; nothing else.
    self.assertEqual([(s.index, s.shape) for s in group.slices],
                     [(0, (12, 4)), (1, (12,))])
    total = sum(int(np.prod(w.shape)) for w in full.trainable_weights)
    self.assertEqual(slicing.client_params(spec), total - 7 * (4 + 1))
    # The client's sub-model on tokens it selected = the full model's logits
    # at those tokens, with input and output narrowed together (one layer).
    keys = collections.OrderedDict(embedding=np.array([0, 2, 3, 7, 9], np.int32))
    sub = sub_model(fn, spec, full, keys)
    self.assertEqual(sub.get_layer('embedding').embeddings.shape, (5, 4))
    self.assertEqual(sub.count_params(), slicing.client_params(spec))
    tokens = np.array([[2, 3, 7, 7, 0], [9, 2, 2, 3, 0]], np.int32)
    local = slicing.local_indices(group, keys['embedding'], tokens)
    self.assertAllClose(sub(local, training=False),
                        tf.gather(full(tokens, training=False), keys['embedding'], axis=-1),
                        atol=1e-5)

  def test_untied_model_slices_output_kernel_too(self):
    full = stackoverflow.create_transformer(
        8, sequence_length=5, num_layers=1, embed_dim=4, num_heads=2, ffn_dim=6,
        tie_embeddings=False)
    spec = slicing.make_select_spec(full, slicing.group_configs(
        full, ['embedding', 'output'], 5, 'top', oov_index=9))
    self.assertEqual([s.shape for s in spec.groups[0].slices],
                     [(12, 4), (4, 12), (12,)])


if __name__ == '__main__':
  tf.test.main()
