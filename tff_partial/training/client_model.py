"""Client models built without their initializers' random draws (issue 17).

TFF's client work (`tff.learning.templates.build_model_delta_client_work`, and
this package's PVT, FedPT and select client works) calls `model_fn()` inside
each client's TensorFlow computation and then assigns the broadcast server
weights to every model variable. The variables' initial values are computed on
every client call (TFF runs the graph's initializers before the computation)
and thrown away: on `emnist_cnn_gn` 4-6 ms of a client's empty round
(`docs/benchmarks.md`).

`zero_initialized(model_fn)` builds the same model with every Keras
initializer replaced by zeros, through TensorFlow's public
`tf.variable_creator_scope`. Only variables that a Keras initializer fills are
changed (layer weights); variables created from a value (TFF's metric
counters, optimizer slots) keep it. The server's initial model must still come
from the real `model_fn`: `with_initial_weights` gives a process built on a
zero-initialized `model_fn` (e.g. TFF's `build_weighted_fed_avg`) the real
model's initialization back. Written here because neither TFF nor Keras has an
option to skip the initializers of a model whose weights are assigned next.
"""

import functools
from typing import Callable

import tensorflow as tf
import tensorflow_federated as tff


def _zeros_creator(next_creator, **kwargs):
  initial_value = kwargs.get('initial_value')
  # Keras's `add_weight` passes `functools.partial(initializer, shape, dtype=...)`,
  # the initializer an `Initializer` or a plain function (the LSTM's
  # unit_forget_bias).
  if (isinstance(initial_value, functools.partial) and len(initial_value.args) == 1
      and set(initial_value.keywords) == {'dtype'}):
    kwargs['initial_value'] = functools.partial(
        tf.keras.initializers.Zeros(), *initial_value.args, **initial_value.keywords)
  return next_creator(**kwargs)


def zero_initialized(model_fn: Callable[[], object]) -> Callable[[], object]:
  """`model_fn` whose Keras-initialized variables start at zeros.

  For client models only, whose every variable is assigned (the broadcast
  weights) before it is read. Same variables, names, shapes and order.
  """
  if not callable(model_fn):
    raise ValueError(f'model_fn must be a no-arg callable, got {type(model_fn).__name__}')

  @functools.wraps(model_fn)
  def built_with_zeros():
    with tf.variable_creator_scope(_zeros_creator):
      return model_fn()

  return built_with_zeros


def with_initial_weights(
    process: tff.learning.templates.LearningProcess,
    model_fn: Callable[[], tff.learning.models.VariableModel],
) -> tff.learning.templates.LearningProcess:
  """`process` whose `initialize` starts from `model_fn()`'s initialization.

  For a process built on `zero_initialized(model_fn)` by a builder that also
  takes the server's initial weights from it (TFF's FedAvg builders).
  Type signatures are unchanged:
    initialize: ( -> S@SERVER), next, get/set_model_weights, get/set_hparams:
    those of `process`.
  """

  @tff.tensorflow.computation
  def initial_weights():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  @tff.federated_computation
  def initialize():
    state = process.initialize()
    weights = tff.federated_eval(initial_weights, tff.SERVER)
    return tff.federated_map(process.set_model_weights, (state, weights))

  return tff.learning.templates.LearningProcess(
      initialize, process.next,
      get_model_weights=process.get_model_weights,
      set_model_weights=process.set_model_weights,
      get_hparams_fn=process.get_hparams,
      set_hparams_fn=process.set_hparams)
