"""Client models built with zeros for their initializers (issue 17).

The package's FedAvg builds its clients' models with
`client_model.zero_initialized`; its rounds must be bit-identical to TFF's
own `build_weighted_fed_avg`, and its `initialize` must give TFF's initial
model, since only the thrown-away initial values of the client variables
differ.
"""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from scripts.methods import fedavg as fedavg_method
from tests import task_testing
from tests import testing_utils
from tff_partial.training import client_model


def _keras_model():
  inputs = tf.keras.Input([6], dtype=tf.int32)
  x = tf.keras.layers.Embedding(20, 4, name='embedding')(inputs)
  x = tf.keras.layers.LSTM(5, return_sequences=True, name='lstm')(x)  # Orthogonal recurrent kernel.
  x = tf.keras.layers.Conv1D(4, 3, name='conv', bias_initializer='ones')(x)
  x = tf.keras.layers.GroupNormalization(2, name='norm')(x)  # gamma: ones.
  x = tf.keras.layers.Flatten()(x)
  outputs = tf.keras.layers.Dense(3, name='dense', kernel_initializer='he_normal')(x)
  return tf.keras.Model(inputs, outputs)


class ZeroInitializedTest(tf.test.TestCase):

  def test_every_keras_initialized_variable_starts_at_zero(self):
    with tf.Graph().as_default():
      real = _keras_model()
      real_shapes = [(v.name, v.shape.as_list()) for v in real.weights]
    zeros_fn = client_model.zero_initialized(_keras_model)
    model = zeros_fn()  # Eagerly: the values can be read.
    self.assertEqual([(v.name, v.shape.as_list()) for v in model.weights], real_shapes)
    self.assertLen(model.weights, 10)
    for v in model.weights:
      self.assertAllEqual(v.numpy(), np.zeros(v.shape), msg=v.name)
    # The real model has non-zero values where its initializers draw (or are ones).
    nonzero = [v.name for v in _keras_model().weights if np.any(v.numpy() != 0)]
    self.assertEqual(nonzero, ['embedding/embeddings:0', 'lstm/lstm_cell/kernel:0',
                               'lstm/lstm_cell/recurrent_kernel:0',
                               'lstm/lstm_cell/bias:0',  # unit_forget_bias: ones.
                               'conv/kernel:0', 'conv/bias:0', 'norm/gamma:0',
                               'dense/kernel:0'])

  def test_variables_created_from_a_value_keep_it(self):

    def model_fn():
      dense = tf.keras.layers.Dense(2)
      dense.build([None, 3])
      return tf.Variable([3.0, 4.0], name='counter'), dense

    counter, dense = client_model.zero_initialized(model_fn)()
    self.assertAllEqual(counter.numpy(), [3.0, 4.0])
    self.assertAllEqual(dense.kernel.numpy(), np.zeros([3, 2]))

  def test_rejects_a_non_callable(self):
    with self.assertRaisesRegex(ValueError, 'model_fn must be a no-arg callable, got int'):
      client_model.zero_initialized(3)


class PackageFedAvgTest(tf.test.TestCase):

  def test_rounds_bit_identical_to_tff_fed_avg(self):
    # One batch per client: TFF's EMNIST preprocessing maps batches with
    # deterministic=False (tff_partial/training/determinism.py), so a client's
    # batches could come in another order under load.
    task = testing_utils.femnist_task('emnist_2nn', batch_size=20, max_elements=20)
    built = fedavg_method.build(testing_utils.method_context(task, client_lr=0.1))
    reference = task_testing.build_fedavg(task, client_lr=0.1, server_lr=1.0)
    # initialize: the task model's own (unseeded Glorot-uniform) initialization,
    # drawn anew by every build, so compared by its bounds and spread.
    ours_init = built.process.get_model_weights(built.process.initialize())
    tff_init = reference.get_model_weights(reference.initialize())
    kernel = np.asarray(ours_init.trainable[0])
    self.assertEqual(kernel.shape, (784, 200))
    limit = np.sqrt(6.0 / (784 + 200))
    self.assertLessEqual(np.abs(kernel).max(), limit)
    self.assertAllClose(kernel.std(), limit / np.sqrt(3.0), rtol=0.02)
    self.assertAllClose(kernel.std(), np.asarray(tff_init.trainable[0]).std(), rtol=0.02)
    ours = built.process.set_model_weights(built.process.initialize(), tff_init)
    theirs = reference.set_model_weights(reference.initialize(), tff_init)
    clients = task.train_data.client_ids[:4]
    for round_num in range(2):
      data = task_testing.client_datasets(task, clients)
      ours = built.process.next(ours, data).state
      theirs = reference.next(theirs, data).state
    w_ours = built.process.get_model_weights(ours)
    w_theirs = reference.get_model_weights(theirs)
    for a, b, c in zip(w_ours.trainable, w_theirs.trainable, tff_init.trainable):
      self.assertAllEqual(a, b)
      self.assertNotAllClose(a, c)


if __name__ == '__main__':
  tf.test.main()
