"""Tests of tff_partial.frozen: regeneration, selection and the FedPT process."""
# bazel: timeout=long

import collections
import hashlib
import os
import subprocess
import sys
import textwrap

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import emnist
from tff_partial import frozen
from tff_partial.frozen import process as fedpt_process
from tff_partial.frozen import regeneration
from tff_partial.measure import comm

_REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_DENSE1_PARAMS = 3136 * 512 + 512  # 1,606,144


def _tiny_model():
  return tf.keras.Sequential([
      tf.keras.layers.Input(shape=(4,), name='x'),
      tf.keras.layers.Dense(8, activation='relu', name='dense1'),
      tf.keras.layers.LayerNormalization(name='norm'),
      tf.keras.layers.Dense(
          6, activation='relu', name='dense2',
          kernel_initializer='he_normal', bias_initializer='ones'),
      tf.keras.layers.Dense(3, name='dense3'),
  ], name='tiny')


def _loss():
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _metrics():
  return [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')]


_INPUT_SPEC = collections.OrderedDict(
    x=tf.TensorSpec([None, 4], tf.float32), y=tf.TensorSpec([None, 1], tf.int32))


def _client_data(num_clients=2, n=12, seed=0):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(num_clients):
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = (x[:, :1] > 0).astype(np.int32) + (x[:, 1:2] > 0).astype(np.int32)
    out.append(tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=x, y=y)).batch(4))
  return out


def _tiny_process(frozen_layers, aggregator=None, seed=3):
  return frozen.build_fedpt_process(
      _tiny_model, _loss, _metrics, _INPUT_SPEC,
      frozen_layers=frozen_layers,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
      model_aggregator=aggregator, seed=seed)


def _tiny_initial_weights(seed=0):
  tf.keras.utils.set_random_seed(seed)
  model = _tiny_model()
  return tff.learning.models.ModelWeights(
      trainable=[w.numpy() for w in model.trainable_weights],
      non_trainable=[w.numpy() for w in model.non_trainable_weights])


class RegenerationTest(tf.test.TestCase):

  def test_seed_tensor(self):
    np.testing.assert_array_equal(regeneration.seed_tensor(5), [0, 5])
    np.testing.assert_array_equal(regeneration.seed_tensor(2**31 + 1), [1, 1])
    with self.assertRaisesRegex(ValueError, 'seed'):
      regeneration.seed_tensor(-1)

  def test_path_key_is_stable_sha256(self):
    # Fixed numbers: a change in the derivation would silently change every
    # frozen variable of every saved run.
    self.assertEqual(
        regeneration.path_key('dense1/kernel'),
        int.from_bytes(hashlib.sha256(b'dense1/kernel').digest()[:4], 'big') & 0x7FFFFFFF)

  def test_uses_the_keras_initializer_itself(self):
    seed = regeneration.seed_tensor(11)
    for name in regeneration.SEEDED_INITIALIZERS:
      config = {'scale': 2.0, 'mode': 'fan_avg', 'distribution': 'uniform'} if name == 'VarianceScaling' else {}
      var = regeneration.FrozenVariable('a/kernel', (5, 7), 'float32', name, config)
      int_seed = int(regeneration.variable_seed(seed, 'a/kernel').numpy())
      expected = regeneration.SEEDED_INITIALIZERS[name](seed=int_seed, **config)((5, 7))
      self.assertAllEqual(var.regenerate(seed), expected, msg=name)
    ones = regeneration.FrozenVariable('a/bias', (3,), 'float32', 'Ones', {})
    self.assertAllEqual(ones.regenerate(seed), np.ones(3, np.float32))
    const = regeneration.FrozenVariable('a/bias', (3,), 'float32', 'Constant', {'value': 0.5})
    self.assertAllEqual(const.regenerate(seed), np.full(3, 0.5, np.float32))

  def test_independent_of_graph_and_other_variables(self):
    seed = regeneration.seed_tensor(42)
    a = regeneration.FrozenVariable('dense1/kernel', (6, 5), 'float32', 'GlorotUniform', {})
    b = regeneration.FrozenVariable('dense2/kernel', (6, 5), 'float32', 'GlorotUniform', {})
    eager = a.regenerate(seed).numpy()

    @tf.function
    def in_function(s):
      tf.random.uniform([3])  # unrelated stateful randomness first
      return regeneration.regenerate([b, a], s)

    graph_b, graph_a = in_function(tf.constant(seed))
    self.assertAllEqual(eager, graph_a)
    self.assertNotAllClose(graph_a, graph_b)  # different paths differ
    other_seed = a.regenerate(regeneration.seed_tensor(43))
    self.assertNotAllClose(eager, other_seed)
    # The values follow Glorot's range sqrt(6 / (6 + 5)).
    self.assertLessEqual(np.abs(eager).max(), np.sqrt(6 / 11))
    self.assertGreater(np.abs(eager).max(), 0.5 * np.sqrt(6 / 11))

  def test_bit_identical_in_tff_runtime(self):
    names = sorted(regeneration.SEEDED_INITIALIZERS) + sorted(regeneration.CONSTANT_INITIALIZERS)
    variables = [
        regeneration.FrozenVariable(f'l{i}/kernel', (64, 48), 'float32', name,
                                    {'value': 0.5} if name == 'Constant' else {})
        for i, name in enumerate(names)]
    seed = regeneration.seed_tensor(123)
    eager = regeneration.regenerate(variables, seed)

    @tff.tensorflow.computation(tff.TensorType(np.int32, [2]))
    def in_tff(s):
      return regeneration.regenerate(variables, s)

    for name, a, b in zip(names, eager, in_tff(seed)):
      self.assertEqual(np.asarray(a).tobytes(), np.asarray(b).tobytes(), name)

  def test_unsupported_initializer_is_a_build_time_error(self):

    def model_fn():
      return tf.keras.Sequential([
          tf.keras.layers.Input(shape=(4,)),
          tf.keras.layers.Dense(
              3, name='odd', kernel_initializer=lambda shape, dtype=None: tf.ones(shape)),
      ])

    with self.assertRaisesRegex(ValueError, "'odd/kernel'.*Supported Keras initializers"):
      frozen.plan_freezing(model_fn, ['odd'])

    def orthogonal_fn():
      return tf.keras.Sequential([
          tf.keras.layers.Input(shape=(4,)),
          tf.keras.layers.Dense(3, name='orth', kernel_initializer='orthogonal'),
      ])

    with self.assertRaisesRegex(ValueError, "'orth/kernel'.*QR decomposition"):
      frozen.plan_freezing(orthogonal_fn, ['orth'])
    frozen.plan_freezing(orthogonal_fn, [])  # fine while trainable

  def test_regenerated_in_another_process_bit_identical_to_server(self):
    code = textwrap.dedent("""
        import hashlib
        from tasks import emnist
        from tff_partial import frozen
        plan = frozen.plan_freezing(lambda: emnist.create_cnn(group_norm=True), ['dense1'])
        for v, t in zip(plan.frozen, frozen.regenerate(plan.frozen, frozen.seed_tensor(7))):
          print(v.path, hashlib.sha256(t.numpy().tobytes()).hexdigest())
    """)
    env = dict(os.environ, PYTHONPATH=_REPO, TF_CPP_MIN_LOG_LEVEL='2')
    child = subprocess.run(
        [sys.executable, '-c', code], env=env, cwd=_REPO, capture_output=True,
        text=True, timeout=600, check=True)
    child_hashes = dict(line.split() for line in child.stdout.strip().splitlines())
    self.assertEqual(set(child_hashes), {'dense1/kernel', 'dense1/bias'})

    # The server side: the full model the FedPT process evaluates.
    model_fn = lambda: emnist.create_cnn(group_norm=True)
    input_spec = collections.OrderedDict(
        x=tf.TensorSpec([None, 28, 28, 1], tf.float32), y=tf.TensorSpec([None, 1], tf.int32))
    process = frozen.build_fedpt_process(
        model_fn, _loss, _metrics, input_spec, frozen_layers=['dense1'],
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1), seed=7)
    weights = process.get_model_weights(process.initialize())
    plan = frozen.plan_freezing(model_fn, ['dense1'])
    server = dict(zip(plan.full_trainable, weights.trainable))
    for path, digest in child_hashes.items():
      self.assertEqual(hashlib.sha256(np.asarray(server[path]).tobytes()).hexdigest(), digest, path)
    self.assertEqual(np.asarray(server['dense1/bias']).sum(), 0.0)  # zeros initializer
    self.assertGreater(np.abs(server['dense1/kernel']).max(), 0.0)


def _tiny_lstm():
  return tf.keras.Sequential([
      tf.keras.layers.Input(shape=(5,), dtype=tf.int32),
      tf.keras.layers.Embedding(7, 3, name='embedding'),
      tf.keras.layers.LSTM(4, return_sequences=True, name='lstm1'),
      tf.keras.layers.Dense(7, name='output'),
  ], name='tiny_lstm')


# Child process: sha256 of every regenerated frozen variable, per initializer.
_HASHES_CHILD = textwrap.dedent("""
    import hashlib
    import tensorflow as tf
    from tasks import emnist
    from tests import frozen_test
    from tff_partial import frozen
    cases = [(lambda: emnist.create_cnn(group_norm=True), ['dense1'], init)
             for init in ('glorot_normal', 'he_normal', 'truncated_normal')]
    cases.append((frozen_test._tiny_lstm, ['lstm1'], 'glorot_normal'))
    for fn, layers, init in cases:
      plan = frozen.plan_freezing(fn, layers, init)
      for v, t in zip(plan.frozen, frozen.regenerate(plan.frozen, frozen.seed_tensor(9))):
        print(init, v.path, v.initializer, hashlib.sha256(t.numpy().tobytes()).hexdigest())
""")


class FrozenInitializerTest(tf.test.TestCase):
  """--frozen_initializer: the paper's Gaussian initial values for frozen variables."""

  def test_gaussian_replaces_random_initializers_keeps_constants(self):
    plan = frozen.plan_freezing(_tiny_model, ['dense1', 'dense2'], 'glorot_normal')
    self.assertEqual(
        [(v.path, v.initializer) for v in plan.frozen],
        [('dense1/bias', 'Zeros'), ('dense1/kernel', 'GlorotNormal'),
         ('dense2/bias', 'Ones'), ('dense2/kernel', 'GlorotNormal')])
    seed = regeneration.seed_tensor(5)
    values = dict(zip([v.path for v in plan.frozen], frozen.regenerate(plan.frozen, seed)))
    # Keras' own class, seeded with the variable's seed from (z, path).
    int_seed = int(regeneration.variable_seed(seed, 'dense2/kernel').numpy())
    self.assertAllEqual(values['dense2/kernel'],
                        tf.keras.initializers.GlorotNormal(seed=int_seed)((8, 6)))
    self.assertAllEqual(values['dense2/bias'], np.ones(6, np.float32))
    layer = frozen.plan_freezing(_tiny_model, ['dense2'])
    self.assertEqual(layer.frozen[1].initializer, 'HeNormal')  # its layer's own
    with self.assertRaisesRegex(ValueError, 'frozen_initializer.*layer, glorot_normal'):
      frozen.plan_freezing(_tiny_model, ['dense2'], 'orthogonal')

  def test_frozen_lstm_needs_a_gaussian_and_keeps_the_forget_bias(self):
    # The Orthogonal recurrent kernel cannot be regenerated bit-identically;
    # the error says how to freeze lstm1 anyway.
    with self.assertRaisesRegex(
        ValueError, r"'lstm1/lstm_cell/recurrent_kernel'.*QR.*"
        r'--frozen_initializer=glorot_normal\|he_normal\|truncated_normal.*lstm1'):
      frozen.plan_freezing(_tiny_lstm, ['lstm1'])
    plan = frozen.plan_freezing(_tiny_lstm, ['lstm1'], 'truncated_normal')
    self.assertEqual(
        [(v.path, v.initializer) for v in plan.frozen],
        [('lstm1/lstm_cell/bias', 'UnitForgetBias'),
         ('lstm1/lstm_cell/kernel', 'TruncatedNormal'),
         ('lstm1/lstm_cell/recurrent_kernel', 'TruncatedNormal')])
    bias = plan.frozen[0].regenerate(regeneration.seed_tensor(1))
    self.assertAllEqual(bias, _tiny_lstm().get_layer('lstm1').cell.bias)  # Keras' 0,1,0,0
    self.assertAllEqual(bias, [0] * 4 + [1] * 4 + [0] * 8)

  def test_bit_identical_across_fresh_processes_and_tff_runtime(self):
    hashes = []
    for onednn in ('0', '1'):
      env = dict(os.environ, PYTHONPATH=_REPO, TF_CPP_MIN_LOG_LEVEL='2',
                 TF_ENABLE_ONEDNN_OPTS=onednn)
      child = subprocess.run(
          [sys.executable, '-c', _HASHES_CHILD], env=env, cwd=_REPO,
          capture_output=True, text=True, timeout=600, check=True)
      hashes.append(child.stdout.strip().splitlines())
    self.assertEqual(hashes[0], hashes[1])
    self.assertLen(hashes[0], 3 * 2 + 3)
    by_case = {(init, path): (name, digest)
               for init, path, name, digest in (l.split() for l in hashes[0])}
    self.assertEqual(by_case[('he_normal', 'dense1/kernel')][0], 'HeNormal')
    # The same values from this process's FedPT server (TFF's C++ runtime).
    for fn, layers, init in ((_tiny_lstm, ['lstm1'], 'glorot_normal'),):
      process = frozen.build_fedpt_process(
          fn, _loss, _metrics,
          (tf.TensorSpec([None, 5], tf.int32), tf.TensorSpec([None, 5], tf.int32)),
          frozen_layers=layers, frozen_initializer=init, seed=9,
          client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1))
      weights = process.get_model_weights(process.initialize())
      plan = frozen.plan_freezing(fn, layers, init)
      server = dict(zip(plan.full_trainable, weights.trainable))
      for v in plan.frozen:
        digest = hashlib.sha256(np.asarray(server[v.path]).tobytes()).hexdigest()
        self.assertEqual(by_case[(init, v.path)], (v.initializer, digest), v.path)


class SelectionTest(tf.test.TestCase):

  def test_by_name_regex_and_fraction(self):
    with tf.Graph().as_default():
      model = emnist.create_cnn(group_norm=True)
      self.assertEqual(frozen.select_frozen_layers(model, ['dense1']), ('dense1',))
      # The regex skips normalization layers; naming one freezes it.
      self.assertEqual(
          frozen.select_frozen_layers(model, regex='.*'),
          ('conv1', 'conv2', 'dense1', 'dense2'))
      self.assertEqual(
          frozen.select_frozen_layers(model, ['group_norm']), ('group_norm',))
      # 1,690,174 parameters, largest first: dense1 1,606,144, conv2 51,264,
      # dense2 31,806, conv1 832. Target 4%: dense1 (-> 4.97%), conv2 and
      # dense2 would go below, conv1 does not (-> 4.92%).
      self.assertEqual(
          frozen.select_frozen_layers(model, target_trainable_fraction=0.04),
          ('conv1', 'dense1'))
      # Target 90%: dense1 would go below; conv2, dense2, conv1 fit (95.03%).
      self.assertEqual(
          frozen.select_frozen_layers(model, target_trainable_fraction=0.9),
          ('conv1', 'conv2', 'dense2'))
      self.assertAlmostEqual(
          frozen.trainable_fraction(model, ['dense1']), 84030 / 1690174)

  def test_unknown_layer_names_the_flag_and_the_layers(self):
    with tf.Graph().as_default():
      model = emnist.create_cnn(group_norm=True)
      with self.assertRaisesRegex(
          ValueError, '--frozen_layers.*dense9.*conv1, conv2, group_norm, dense1, dense2'):
        frozen.select_frozen_layers(model, ['dense9'])
    with self.assertRaisesRegex(ValueError, '--frozen_layers.*dense9'):
      frozen.plan_freezing(lambda: emnist.create_cnn(group_norm=True), ['dense9'])
    with self.assertRaisesRegex(ValueError, '--frozen_regex'):
      with tf.Graph().as_default():
        frozen.select_frozen_layers(emnist.create_cnn(), regex='nothing')


def _small_convnet():
  """conv1 gn1 conv2 gn2 conv3 gn3 dense: a ResNet-like stack in miniature."""
  x = inputs = tf.keras.layers.Input((8, 8, 1))
  for i, filters in enumerate((4, 8, 32), start=1):
    x = tf.keras.layers.Conv2D(filters, 3, padding='same', name=f'conv{i}')(x)
    x = tf.keras.layers.GroupNormalization(2, name=f'gn{i}')(x)
    x = tf.keras.layers.ReLU()(x)
  x = tf.keras.layers.GlobalAveragePooling2D()(x)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(3, name='dense')(x))


def _step_op_counts(frozen_layers) -> collections.Counter:
  """Op types one traced training step runs to train what is not frozen.

  The step is the client step of TFF's model-delta client work: a
  GradientTape over the model's forward pass, gradients of
  `model.trainable_variables` (FedPT's client model marks frozen layers
  `trainable=False`).
  """
  model = _small_convnet()
  fedpt_process.freeze_layers(model, frozen_layers)
  loss_fn = _loss()

  @tf.function
  def step(x, y):
    with tf.GradientTape() as tape:
      loss = loss_fn(y, model(x, training=True))
    return tape.gradient(loss, model.trainable_variables)

  graph = step.get_concrete_function(
      tf.TensorSpec([2, 8, 8, 1]), tf.TensorSpec([2, 1], tf.int32)).graph
  # The ops the gradients depend on: what runs (TensorFlow prunes the rest,
  # e.g. the gradients of frozen kernels, which the tape builds but nothing
  # reads).
  needed, stack = set(), [t.op for t in graph.outputs]
  while stack:
    op = stack.pop()
    if op.name not in needed:
      needed.add(op.name)
      stack.extend(t.op for t in op.inputs)
      stack.extend(op.control_inputs)
  return collections.Counter(op.type for op in graph.get_operations() if op.name in needed)


class FreezingOrderTest(tf.test.TestCase):

  def test_orders(self):
    with tf.Graph().as_default():
      model = _small_convnet()
      # Trainable parameters: conv1 40, conv2 296, conv3 2,336, dense 99, gn 8+16+64.
      # Largest first to 10%: conv3 (-> 17.0%), then conv2 (-> 7.9%) would go
      # below; dense, conv1 fit: convs 1 and 3 and dense are frozen.
      self.assertEqual(
          frozen.select_frozen_layers(model, target_trainable_fraction=0.1),
          ('conv1', 'conv3', 'dense'))
      # Input first: the shortest prefix (normalization layers included)
      # after which at most 10% trains: up to conv3 (gn3 + dense train: 5.7%).
      prefix = frozen.select_frozen_layers(
          model, target_trainable_fraction=0.1, order=frozen.INPUT_FIRST)
      self.assertEqual(prefix, ('conv1', 'conv2', 'conv3', 'gn1', 'gn2'))
      self.assertAlmostEqual(frozen.trainable_fraction(model, prefix), 163 / 2859)
      with self.assertRaisesRegex(ValueError, '--frozen_order.*largest_first, input_first'):
        frozen.select_frozen_layers(model, target_trainable_fraction=0.1, order='random')

  def test_backward_pass_stops_at_a_frozen_prefix(self):
    # TensorFlow records no gradient op for a frozen prefix: with the three
    # convolutions frozen but gn1/gn2 trainable before conv2/conv3, their
    # input gradients are still needed (2 backprop-input ops; none for conv1,
    # whose input is the data); with the prefix conv1..conv3 frozen
    # (normalization layers included) no convolution is differentiated.
    everything = _step_op_counts([])
    all_convs = _step_op_counts(['conv1', 'conv2', 'conv3'])
    prefix = _step_op_counts(['conv1', 'gn1', 'conv2', 'gn2', 'conv3'])
    self.assertEqual((everything['Conv2DBackpropFilter'], everything['Conv2DBackpropInput']),
                     (3, 2))
    self.assertEqual((all_convs['Conv2DBackpropFilter'], all_convs['Conv2DBackpropInput']),
                     (0, 2))
    self.assertEqual((prefix['Conv2DBackpropFilter'], prefix['Conv2DBackpropInput']),
                     (0, 0))
    self.assertEqual(prefix['Conv2D'], all_convs['Conv2D'])


class ProcessTest(tf.test.TestCase):

  def test_type_signature_sends_only_trainable_and_seed(self):
    process = _tiny_process(['dense1', 'dense2'])
    state_type = process.next.type_signature.parameter[0].member
    f32 = np.float32
    # dense3 kernel+bias and LayerNorm gamma+beta are trainable.
    trainable = [tff.TensorType(f32, [8]), tff.TensorType(f32, [8]),
                 tff.TensorType(f32, [6, 3]), tff.TensorType(f32, [3])]
    expected_weights = tff.StructWithPythonType(
        [('trainable', tff.StructWithPythonType(trainable, list)),
         ('non_trainable', tff.StructWithPythonType(
             [tff.TensorType(np.int32, [2])], list))],
        tff.learning.models.ModelWeights)
    self.assertTrue(state_type.global_model_weights.is_equivalent_to(expected_weights))
    # Exact bytes per client: (8 + 8 + 18 + 3) floats (+ 8 seed bytes down).
    b = comm.client_bytes(process.next)
    self.assertEqual(b.down_payload, 4 * 37 + 8)
    self.assertEqual(b.up_payload, 4 * 37)
    # The full model comes back from get_model_weights.
    full = process.get_model_weights.type_signature.result
    self.assertEqual([t.shape for t in full.trainable],
                     [(4, 8), (8,), (8,), (8,), (8, 6), (6,), (6, 3), (3,)])

  def test_emnist_cnn_gn_bytes(self):
    model_fn = lambda: emnist.create_cnn(group_norm=True)
    input_spec = collections.OrderedDict(
        x=tf.TensorSpec([None, 28, 28, 1], tf.float32), y=tf.TensorSpec([None, 1], tf.int32))
    process = frozen.build_fedpt_process(
        model_fn, _loss, _metrics, input_spec, frozen_layers=['dense1'],
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1))
    params = 1690174
    b = comm.client_bytes(process.next)
    self.assertEqual(b.down_payload, 4 * (params - _DENSE1_PARAMS) + 8)
    self.assertEqual(b.up_payload, 4 * (params - _DENSE1_PARAMS))

  def test_frozen_never_change_trainable_do(self):
    process = _tiny_process(['dense2'])
    state = process.set_model_weights(process.initialize(), _tiny_initial_weights())
    before = process.get_model_weights(state)
    plan = frozen.plan_freezing(_tiny_model, ['dense2'])
    regenerated = dict(
        (v.path, t) for v, t in zip(plan.frozen, frozen.regenerate(plan.frozen, frozen.seed_tensor(3))))
    data = _client_data()
    for _ in range(2):
      state = process.next(state, data).state
    after = process.get_model_weights(state)
    for path, b, a in zip(plan.full_trainable, before.trainable, after.trainable):
      if path.startswith('dense2/'):
        self.assertAllEqual(a, b, msg=path)
        self.assertAllEqual(a, regenerated[path], msg=path)
      else:
        self.assertNotAllClose(a, b, msg=path)
    # He-normal kernel (std sqrt(2 / 8)) and ones bias, as dense2's initializers say.
    kernel = dict(zip(plan.full_trainable, after.trainable))['dense2/kernel']
    self.assertBetween(np.std(kernel), 0.25, 0.75)
    self.assertAllEqual(dict(zip(plan.full_trainable, after.trainable))['dense2/bias'], np.ones(6))

  def test_round_is_one_sgd_step_on_the_regenerated_model_by_hand(self):
    # Each client's one computation regenerates dense2 from z, then takes one
    # SGD step (one batch) on the other variables; the server applies the
    # example-weighted mean of the deltas with lr 1. Reference: a plain Keras
    # model with the full weights and tf.GradientTape.
    process = _tiny_process(['dense2'])
    state = process.set_model_weights(process.initialize(), _tiny_initial_weights(seed=2))
    full = process.get_model_weights(state)
    data = _client_data(num_clients=2, n=4, seed=7)  # one batch of 4 per client
    model = _tiny_model()
    for v, w in zip(model.trainable_weights, full.trainable):
      v.assign(w)
    trained = [v for v in model.trainable_weights if not v.name.startswith('dense2/')]
    deltas = []
    for dataset in data:
      batch = next(iter(dataset))
      with tf.GradientTape() as tape:
        loss = _loss()(batch['y'], model(batch['x'], training=True))
      deltas.append([0.1 * g.numpy() for g in tape.gradient(loss, trained)])
    expected = {v.name.split(':')[0]: v.numpy() - (d1 + d2) / 2
                for v, d1, d2 in zip(trained, *deltas)}
    after = process.get_model_weights(process.next(state, data).state)
    plan = frozen.plan_freezing(_tiny_model, ['dense2'])
    for path, before, value in zip(plan.full_trainable, full.trainable, after.trainable):
      if path.startswith('dense2/'):
        self.assertAllEqual(value, before, msg=path)
      else:
        self.assertAllClose(value, expected[path], rtol=1e-6, atol=1e-6, msg=path)
        self.assertNotAllClose(value, before, msg=path)

  def test_nothing_frozen_equals_fed_avg(self):
    initial = _tiny_initial_weights(seed=5)
    fedpt = _tiny_process([])
    fedavg = tff.learning.algorithms.build_weighted_fed_avg(
        lambda: tff.learning.models.from_keras_model(
            _tiny_model(), loss=_loss(), input_spec=_INPUT_SPEC, metrics=_metrics()),
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0))
    s1 = fedpt.set_model_weights(fedpt.initialize(), initial)
    s2 = fedavg.set_model_weights(fedavg.initialize(), initial)
    for r in range(3):
      data = _client_data(seed=r)
      s1 = fedpt.next(s1, data).state
      s2 = fedavg.next(s2, data).state
    w1, w2 = fedpt.get_model_weights(s1), fedavg.get_model_weights(s2)
    for a, b, c in zip(w1.trainable, w2.trainable, initial.trainable):
      self.assertAllClose(a, b, rtol=1e-6, atol=1e-6)
      self.assertNotAllClose(a, c)

  def test_unweighted_dp_aggregator_on_trainable_part(self):
    dp = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
        noise_multiplier=0.0, clients_per_round=2, clip=1e-3)
    process = _tiny_process(['dense1'], aggregator=dp)
    state = process.set_model_weights(process.initialize(), _tiny_initial_weights())
    before = process.get_model_weights(state)
    state = process.next(state, _client_data()).state
    after = process.get_model_weights(state)
    deltas = [np.asarray(a) - np.asarray(b) for a, b in zip(after.trainable, before.trainable)]
    # dense1 (first two) frozen; the clipped mean update has norm <= clip.
    self.assertAllEqual(deltas[0], np.zeros_like(deltas[0]))
    total_norm = np.sqrt(sum(np.sum(d**2) for d in deltas[2:]))
    self.assertGreater(total_norm, 0.0)
    self.assertLessEqual(total_norm, 1e-3 * (1 + 1e-4))

  def test_set_model_weights_takes_the_trainable_part(self):
    process = _tiny_process(['dense1'])
    initial = _tiny_initial_weights(seed=9)
    state = process.set_model_weights(process.initialize(), initial)
    got = process.get_model_weights(state)
    # dense1 (0, 1) regenerated from the seed; all others as given.
    self.assertNotAllClose(got.trainable[0], initial.trainable[0])
    for a, b in zip(got.trainable[2:], initial.trainable[2:]):
      self.assertAllEqual(a, b)
    self.assertAllEqual(state.global_model_weights.non_trainable[0], [0, 3])


if __name__ == '__main__':
  tf.test.main()
