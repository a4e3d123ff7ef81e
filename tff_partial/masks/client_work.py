"""PVT client work: train only the unmasked variables, send their deltas.

Yang et al., *Partial Variable Training for Efficient On-Device Federated
Learning* (PVT), section 2: a client trains a subset of the variables, the
others stay frozen for the round, and only the trained variables' changes are
returned.

The client's input carries its mask with its data:
  client data type `<data=D*, mask=float32[n]*>`: the dataset, and the mask
  as a one-element dataset (`ClientWorkProcess` accepts only sequences as
  client data) holding float32[n] (`n` trainable variables, TFF order;
  1 = train, 0 = freeze). `client_input(dataset, mask)` builds it.
Federated type signature of `next`:
  `(<S@SERVER, W@CLIENTS, {<data=D*, mask=float32[n]*>}@CLIENTS> ->
    <state=S@SERVER,
     result={ClientResult(update=<update=W.trainable, mask=float32[n]>,
                          update_weight=float32)}@CLIENTS,
     measurements=<train=metrics>@SERVER>)`
with `S` the client optimizer's hyperparameters (as TFF's FedAvg client work).

Training mirrors `tff.learning.templates.build_model_delta_client_work` step by
step (same loop, loss, optimizer calls, `initial - trained` update, non-finite
guard, example weighting) so that with a mask of ones it is bit-identical to
TFF's FedAvg. With a mask, each batch's gradients of frozen variables are
replaced by zeros before the optimizer step and frozen variables are reset to
their round-start value after it (so no optimizer can move them, e.g. through
weight decay), and their update entries are exactly zero.

Memory and compute. With a mask that changes per round or per client, every
client of the round runs one TFF computation traced once for all masks, so the
mask is a runtime tensor and TensorFlow's backward pass still computes (and
buffers the activations for) the frozen variables' gradients, then drops them.
A real PVT client builds its training step for its own mask and differentiates
only its trained variables: that is what
`tff_partial.measure.memory.client_training_peak(..., trainable_mask=...)`
measures. When the mask is known when the process is built (the `fixed`
scheme), `static_mask` makes the simulated clients do the same: the gradient
tape differentiates only the trained variables (and each client checks that
the mask it receives is that one).
"""

import collections
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
# TFF's own loop builder (the one build_model_delta_client_work uses); not
# exported under tff.learning.
from tensorflow_federated.python.learning import loop_builder


def client_input(dataset: tf.data.Dataset, mask) -> collections.OrderedDict:
  """The client value PVT's `next` takes: the dataset and its mask."""
  return collections.OrderedDict(
      data=dataset,
      mask=tf.data.Dataset.from_tensors(tf.constant(mask, tf.float32)))


def _zero_all_if_any_non_finite(structure):
  """(structure, 0), or (zeros, 1) if any entry is NaN/inf (TFF's FedAvg guard)."""
  flat = tf.nest.flatten(structure)
  all_finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in flat])
  return tf.cond(
      all_finite,
      lambda: (structure, tf.constant(0)),
      lambda: (tf.nest.map_structure(tf.zeros_like, structure), tf.constant(1)))


def build_pvt_client_work(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    optimizer: tff.learning.optimizers.Optimizer,
    client_weighting: tff.learning.ClientWeighting = tff.learning.ClientWeighting.NUM_EXAMPLES,
    metrics_aggregator=None,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE),
    static_mask: Optional[Sequence[bool]] = None,
) -> tff.learning.templates.ClientWorkProcess:
  """A `ClientWorkProcess` training the unmasked variables of each client.

  `loop_implementation` picks TFF's dataset loop (`tff.learning.LoopImplementation`),
  as `build_model_delta_client_work` does. `static_mask` (one bool per
  trainable variable): every client's mask, known now (the `fixed` scheme);
  then only the trained variables are differentiated.
  """
  if not isinstance(optimizer, tff.learning.optimizers.Optimizer):
    raise ValueError(
        f'optimizer must be a tff.learning.optimizers.Optimizer, got {type(optimizer).__name__}')
  if client_weighting not in (tff.learning.ClientWeighting.NUM_EXAMPLES,
                              tff.learning.ClientWeighting.UNIFORM):
    raise ValueError(f'client_weighting must be NUM_EXAMPLES or UNIFORM, got {client_weighting}')
  metrics_aggregator = metrics_aggregator or tff.learning.metrics.sum_then_finalize
  training_loop = loop_builder.build_training_loop(loop_implementation)

  # Built in a throwaway graph, as TFF does, so no variables leak into the
  # global context.
  with tf.Graph().as_default():
    model = model_fn()
    metrics_aggregation_fn = metrics_aggregator(model.metric_finalizers())
    weights_type = tff.learning.models.weights_type_from_model(model)
  num_variables = len(weights_type.trainable)
  if static_mask is not None:
    static_mask = tuple(bool(m) for m in static_mask)
    if len(static_mask) != num_variables:
      raise ValueError(f'static_mask has {len(static_mask)} entries; the model has '
                       f'{num_variables} trainable variables')
  data_type = tff.SequenceType(tff.types.tensorflow_to_type(model.input_spec))
  client_data_type = tff.StructWithPythonType(
      [('data', data_type),
       ('mask', tff.SequenceType(tff.TensorType(np.float32, [num_variables])))],
      collections.OrderedDict)

  hparams = optimizer.get_hparams(optimizer.initialize(tf.TensorSpec([], tf.float32)))

  @tff.federated_computation()
  def init_fn():
    return tff.federated_value(hparams, tff.SERVER)

  state_type = init_fn.type_signature.result.member

  @tff.tensorflow.computation(state_type)
  def get_hparams_fn(state):
    return state

  @tff.tensorflow.computation(state_type, state_type)
  def set_hparams_fn(state, new_hparams):
    del state
    return new_hparams

  @tff.tensorflow.computation(state_type, weights_type, client_data_type)
  def client_update(optimizer_hparams, initial_weights, client_data):
    model = model_fn()
    # The mask is a one-element dataset: TFF's `ClientWorkProcess` takes client
    # data made of sequences only.
    mask = client_data['mask'].reduce(
        tf.zeros([num_variables], tf.float32), lambda _, m: m)
    if static_mask is not None:
      check = tf.debugging.assert_equal(
          mask, tf.constant(static_mask, tf.float32),
          message='PVT: a client mask differs from the static (fixed) mask')
      with tf.control_dependencies([check]):
        mask = tf.identity(mask)
    return _train(model, optimizer, optimizer_hparams, initial_weights,
                  client_data['data'], mask, client_weighting, training_loop,
                  static_mask)

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(weights_type, tff.CLIENTS),
      tff.FederatedType(client_data_type, tff.CLIENTS))
  def next_fn(state, weights, client_data):
    state_at_clients = tff.federated_broadcast(state)
    client_result, model_outputs = tff.federated_map(
        client_update, (state_at_clients, weights, client_data))
    train_metrics = metrics_aggregation_fn(model_outputs)
    measurements = tff.federated_zip(collections.OrderedDict(train=train_metrics))
    return tff.templates.MeasuredProcessOutput(state, client_result, measurements)

  return tff.learning.templates.ClientWorkProcess(
      init_fn, next_fn, get_hparams_fn=get_hparams_fn, set_hparams_fn=set_hparams_fn)


@tf.function
def _train(model, optimizer, optimizer_hparams, initial_weights, data, mask,
           client_weighting, training_loop, static_mask):
  model_weights = tff.learning.models.ModelWeights.from_model(model)
  tf.nest.map_structure(lambda v, t: v.assign(t), model_weights, initial_weights)
  trainable = tuple(tf.nest.flatten(model_weights.trainable))
  start = tuple(tf.nest.flatten(initial_weights.trainable))
  trained = [mask[i] > 0 for i in range(len(trainable))]

  def reduce_fn(loop_state, batch):
    num_examples, optimizer_state = loop_state
    with tf.GradientTape() as tape:
      output = model.forward_pass(batch, training=True)
    if static_mask is None:
      gradients = tape.gradient(output.loss, trainable)
      gradients = tuple(
          tf.where(trained[i], g, tf.zeros_like(g)) for i, g in enumerate(gradients))
    else:  # differentiate only the trained variables
      sources = [v for v, m in zip(trainable, static_mask) if m]
      computed = iter(tape.gradient(output.loss, sources))
      gradients = tuple(next(computed) if m else tf.zeros_like(v)
                        for v, m in zip(trainable, static_mask))
    optimizer_state, updated = optimizer.next(optimizer_state, trainable, gradients)
    for i, (variable, new_value) in enumerate(zip(trainable, updated)):
      variable.assign(tf.where(trained[i], new_value, start[i]))
    if output.num_examples is None:
      num_examples += tf.shape(output.predictions, out_type=tf.int64)[0]
    else:
      num_examples += tf.cast(output.num_examples, tf.int64)
    return num_examples, optimizer_state

  specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)
  optimizer_state = optimizer.set_hparams(optimizer.initialize(specs), optimizer_hparams)
  num_examples, _ = training_loop(
      reduce_fn, data, lambda: (tf.zeros([], tf.int64), optimizer_state))

  update = tf.nest.map_structure(
      tf.subtract, initial_weights.trainable, model_weights.trainable)
  update, non_finite = _zero_all_if_any_non_finite(update)
  if client_weighting == tff.learning.ClientWeighting.NUM_EXAMPLES:
    weight = tf.cast(num_examples, tf.float32)
  else:
    weight = tf.constant(1.0)
  # A client with a non-finite update contributes nothing, metrics included.
  weight = tf.where(non_finite > 0, tf.constant(0.0), weight)
  if non_finite > 0:
    model.reset_metrics()
  result = tff.learning.templates.ClientResult(
      update=collections.OrderedDict(update=update, mask=mask),
      update_weight=weight)
  return result, model.report_local_unfinalized_metrics()
