"""`build_fedpt_process`: FedPT as a `tff.learning.templates.LearningProcess`.

Sidahmed et al., *Efficient and Private Federated Learning with Partially
Trainable Networks*, Algorithm 1. The server model is split into the trainable
part y and the frozen part, which is never stored or sent: it is regenerated
from one stateless-RNG seed z (`regeneration.py`).

Composition (`tff.learning.templates.compose_learning_process`):

* global model weights on the server: `ModelWeights(trainable=y,
  non_trainable=[z, *carried])` where z is `int32[2]` and `carried` are the
  model's genuinely non-trainable variables of unfrozen layers (e.g. batch-norm
  statistics; none in this project's models). No frozen tensor is in the state.
* distributor: TFF's `build_broadcast_process`: y and z go down (line 3).
* client work: in one TensorFlow computation per client, (y, z) becomes the
  full local model (local, no communication; line 5), and TFF's own client
  update of `build_model_delta_client_work` trains it, on a model whose frozen
  layers have `trainable=False`, so it trains y only and returns y's delta
  (lines 6-10).
* aggregator: any weighted factory on y's delta (default `MeanFactory`); an
  unweighted one (DP) via `factory_utils.as_weighted_aggregator` (line 12).
* finalizer: TFF's `build_apply_optimizer_finalizer` with the server
  optimizer, applied to y; z passes through unchanged (line 13).

Type signature of `next`:
  (<S@SERVER, {D*}@CLIENTS> -> <S@SERVER, M@SERVER>)
with the broadcast `<trainable=Y, non_trainable=<int32[2], C>>@CLIENTS` and the
upload `Y@CLIENTS` (plus the scalar client weight): exactly the trainable
variables, the seed, and the carried non-trainables.

`get_model_weights(state)` returns the *full* model (frozen variables
regenerated from z, trained ones from y) in the order of the task model's
`tff.learning.models.ModelWeights`; `set_model_weights(state, full weights)`
takes the trainable (and carried) variables from full model weights and keeps
the state's seed: the frozen values given are ignored, since frozen variables
are always the ones z generates.
"""

import collections
import dataclasses
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.aggregators import factory_utils
from tensorflow_federated.python.learning.templates import model_delta_client_work

from tff_partial.frozen import regeneration
from tff_partial.frozen import selection
from tff_partial.training import client_model


@dataclasses.dataclass(frozen=True)
class FreezePlan:
  """Where every variable of the model goes, by stable path.

  Attributes:
    frozen_layers: frozen layer paths.
    frozen: the regenerated variables, with their initializers.
    full_trainable / full_non_trainable: the task model's `ModelWeights` order.
    client_trainable: the trainable variables y (server state and client model
      order).
    client_non_trainable: the client model's non-trainable order (frozen and
      carried).
    carried: non-trainable variables of unfrozen layers, kept on the server.
    num_params: path -> number of parameters.
  """

  frozen_layers: tuple
  frozen: tuple
  full_trainable: tuple
  full_non_trainable: tuple
  client_trainable: tuple
  client_non_trainable: tuple
  carried: tuple
  num_params: dict

  @property
  def params_total(self) -> int:
    return sum(self.num_params.values())

  @property
  def params_trainable(self) -> int:
    return sum(self.num_params[p] for p in self.client_trainable)

  @property
  def params_frozen(self) -> int:
    return sum(v.num_params for v in self.frozen)


def freeze_layers(keras_model: tf.keras.Model, frozen_layers: Sequence[str]) -> None:
  """Sets `trainable=False` on the layers at `frozen_layers` (paths)."""
  by_path = {info.path: info.layer for info in regeneration.walk_layers(keras_model)}
  for path in frozen_layers:
    if path not in by_path:
      raise ValueError(
          f'--frozen_layers: the model {keras_model.name!r} has no layer {path!r}; '
          'its layers are: '
          + ', '.join(selection.layer_names_with_weights(keras_model)))
    by_path[path].trainable = False


def plan_freezing(
    keras_model_fn: Callable[[], tf.keras.Model],
    frozen_layers: Sequence[str],
    frozen_initializer: str = regeneration.LAYER,
) -> FreezePlan:
  """Inspects a throwaway model (in its own graph) and plans the split.

  `frozen_initializer`: `layer` (each frozen variable's own Keras
  initializer) or a seeded Gaussian (`regeneration.FROZEN_INITIALIZERS`).
  Raises `ValueError` for unknown layer names and for frozen variables whose
  initializer cannot be regenerated from a seed.
  """
  # A throwaway graph, as TFF's `baseline_task.py` does: building the model
  # must not leave variables in the caller's (eager) context.
  with tf.Graph().as_default():
    model = keras_model_fn()
    paths = regeneration.weight_paths(model)
    full_trainable = tuple(paths[id(w)] for w in model.trainable_weights)
    full_non_trainable = tuple(paths[id(w)] for w in model.non_trainable_weights)
    num_params = {
        paths[id(w)]: int(np.prod(w.shape, dtype=np.int64)) for w in model.weights}
    frozen_paths = selection.frozen_weight_paths(model, frozen_layers)
    frozen = []
    for info in regeneration.walk_layers(model):
      for path, w in info.weights:
        if path in frozen_paths:
          attr = path.rsplit('/', 1)[1]
          initializer = regeneration.initializer_of(
              info.layer, attr, path, frozen_initializer)
          frozen.append(regeneration.describe_variable(path, w, initializer))
    freeze_layers(model, frozen_layers)
    client_trainable = tuple(paths[id(w)] for w in model.trainable_weights)
    client_non_trainable = tuple(paths[id(w)] for w in model.non_trainable_weights)
  leaked = set(client_trainable) & frozen_paths
  if leaked:
    raise ValueError(f'frozen variables {sorted(leaked)} are still trainable')
  carried = tuple(p for p in client_non_trainable if p not in frozen_paths)
  return FreezePlan(
      frozen_layers=tuple(frozen_layers),
      frozen=tuple(sorted(frozen, key=lambda v: v.path)),
      full_trainable=full_trainable,
      full_non_trainable=full_non_trainable,
      client_trainable=client_trainable,
      client_non_trainable=client_non_trainable,
      carried=carried,
      num_params=num_params,
  )


def _by_path(plan: FreezePlan, server_weights) -> dict:
  """path -> tensor for every variable, regenerating the frozen ones from z."""
  seed, *carried = server_weights.non_trainable
  values = dict(zip(plan.client_trainable, server_weights.trainable))
  values.update(zip(plan.carried, carried))
  values.update(
      (v.path, value) for v, value in zip(plan.frozen, regeneration.regenerate(plan.frozen, seed)))
  return values


def client_model_weights(plan: FreezePlan, server_weights) -> tff.learning.models.ModelWeights:
  """(y, z) -> the client model's weights (Algorithm 1, line 5: Reconstruct)."""
  values = _by_path(plan, server_weights)
  return tff.learning.models.ModelWeights(
      trainable=[values[p] for p in plan.client_trainable],
      non_trainable=[values[p] for p in plan.client_non_trainable])


def full_model_weights(plan: FreezePlan, server_weights) -> tff.learning.models.ModelWeights:
  """(y, z) -> the full model's weights in the task model's order."""
  values = _by_path(plan, server_weights)
  return tff.learning.models.ModelWeights(
      trainable=[values[p] for p in plan.full_trainable],
      non_trainable=[values[p] for p in plan.full_non_trainable])


def server_model_weights(plan: FreezePlan, full_weights, seed) -> tff.learning.models.ModelWeights:
  """Full model weights + z -> the server's (y, [z, *carried])."""
  values = dict(zip(plan.full_trainable, full_weights.trainable))
  values.update(zip(plan.full_non_trainable, full_weights.non_trainable))
  return tff.learning.models.ModelWeights(
      trainable=[values[p] for p in plan.client_trainable],
      non_trainable=[seed] + [values[p] for p in plan.carried])


def _build_client_work(plan, server_weights_type, model_fn, optimizer, client_weighting,
                       metrics_aggregator, loop_implementation):
  """TFF's model-delta client work on (y, z), with the model rebuilt in the same call.

  Each client runs ONE TensorFlow computation: regenerate the frozen variables
  from z (Algorithm 1, line 5), then TFF's own client update
  (`build_model_delta_update_with_tff_optimizer`, the function inside
  `tff.learning.templates.build_model_delta_client_work`) on the full local
  model. The state, hyperparameters and metric aggregation are those of TFF's
  `build_model_delta_client_work` for the same model (built here as `inner`).

  Written here because TFF's client work takes model weights, not a function
  of them. The two-call form (a `federated_map` of the regeneration, then
  TFF's client work) computes the same values but gives each client two
  computations, and TFF's worker bounds concurrent calls per computation:
  with `--local_client_parallelism=auto` (2 calls at once on 2 cores) its
  rounds on the ResNet-18-GN (blocks 1-4 frozen, 4 clients) left a core idle
  for up to a client's training time: rounds of 3.6-5.2 s at 6.8-7.6 CPU
  seconds, 1.46 cores busy, against 1.94 with one computation
  (`docs/benchmarks.md`, issue 17, Zen 5).
  """
  inner = tff.learning.templates.build_model_delta_client_work(
      model_fn, optimizer, client_weighting, metrics_aggregator=metrics_aggregator,
      loop_implementation=loop_implementation)
  if metrics_aggregator is None:
    metrics_aggregator = tff.learning.metrics.sum_then_finalize
  with tf.Graph().as_default():
    metrics_aggregation_fn = metrics_aggregator(model_fn().metric_finalizers())
  inner_state_type, _, data_type = inner.next.type_signature.parameter

  @tff.tensorflow.computation(inner_state_type.member, server_weights_type, data_type.member)
  def client_update(optimizer_hparams, server_weights, dataset):
    update = model_delta_client_work.build_model_delta_update_with_tff_optimizer(
        model_fn=model_fn, weighting=client_weighting,
        loop_implementation=loop_implementation)
    return update(optimizer, client_model_weights(plan, server_weights), dataset,
                  optimizer_hparams)

  @tff.federated_computation(
      inner_state_type,
      tff.FederatedType(server_weights_type, tff.CLIENTS),
      data_type)
  def next_fn(state, weights, client_data):
    client_result, model_outputs = tff.federated_map(
        client_update, (tff.federated_broadcast(state), weights, client_data))
    measurements = tff.federated_zip(
        collections.OrderedDict(train=metrics_aggregation_fn(model_outputs)))
    return tff.templates.MeasuredProcessOutput(state, client_result, measurements)

  return tff.learning.templates.ClientWorkProcess(
      inner.initialize, next_fn,
      get_hparams_fn=inner.get_hparams, set_hparams_fn=inner.set_hparams)


def build_fedpt_process(
    keras_model_fn: Callable[[], tf.keras.Model],
    loss_fn: Callable[[], tf.keras.losses.Loss],
    metrics_fn: Callable[[], list],
    input_spec: Any,
    *,
    frozen_layers: Sequence[str],
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    model_aggregator: Optional[Any] = None,
    seed: int = 0,
    metrics_aggregator: Optional[Any] = None,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE),
    frozen_initializer: str = regeneration.LAYER,
) -> tff.learning.templates.LearningProcess:
  """Builds FedPT (Algorithm 1) for a Keras model with `frozen_layers` frozen.

  The arguments mirror a `tasks.registry.Task` (`keras_model_fn`, `loss_fn`,
  `metrics_fn`) and its `baseline.datasets.element_type_structure`
  (`input_spec`), since FedPT must change the Keras model (freeze layers)
  before TFF wraps it.

  Args:
    keras_model_fn: no-arg callable returning a new uncompiled Keras model with
      stable layer names.
    loss_fn: no-arg callable returning the Keras loss.
    metrics_fn: no-arg callable returning a list of Keras metrics.
    input_spec: the model's input spec (TFF `from_keras_model`).
    frozen_layers: layer paths to freeze (see `selection.select_frozen_layers`
      for regex / fraction selection); may be empty (then FedPT is FedAvg).
    client_optimizer_fn: `tff.learning.optimizers.Optimizer` for clients.
    server_optimizer_fn: server optimizer; default SGD with learning rate 1.
    model_aggregator: None (weighted mean), a
      `tff.aggregators.WeightedAggregationFactory`, or an
      `UnweightedAggregationFactory` (e.g. DP), applied to the trainable
      deltas only.
    seed: z as an integer in [0, 2**62); sent to clients as `int32[2]`.
    metrics_aggregator: as in `tff.learning.algorithms.build_weighted_fed_avg`.
    loop_implementation: the clients' dataset loop, as in
      `tff.learning.algorithms.build_weighted_fed_avg`.
    frozen_initializer: `layer` (regenerate each frozen variable with its
      layer's initializer) or `glorot_normal` / `he_normal` /
      `truncated_normal` (the paper's Gaussian initial values; see
      `regeneration.FROZEN_INITIALIZERS`).

  Returns:
    A `tff.learning.templates.LearningProcess` (see the module docstring).
  """
  for name, fn in (('keras_model_fn', keras_model_fn), ('loss_fn', loss_fn),
                   ('metrics_fn', metrics_fn)):
    if not callable(fn):
      raise ValueError(f'{name} must be a no-arg callable, got {fn!r}')
  if isinstance(frozen_layers, str):
    raise ValueError(
        f'frozen_layers must be a sequence of layer names, got the string {frozen_layers!r}')
  if not isinstance(client_optimizer_fn, tff.learning.optimizers.Optimizer):
    raise ValueError('client_optimizer_fn must be a tff.learning.optimizers.Optimizer')
  if server_optimizer_fn is None:
    server_optimizer_fn = tff.learning.optimizers.build_sgdm(learning_rate=1.0)
  if not isinstance(server_optimizer_fn, tff.learning.optimizers.Optimizer):
    raise ValueError('server_optimizer_fn must be a tff.learning.optimizers.Optimizer')
  client_weighting = tff.learning.ClientWeighting.NUM_EXAMPLES
  if model_aggregator is None:
    model_aggregator = tff.aggregators.MeanFactory()
  elif isinstance(model_aggregator, tff.aggregators.UnweightedAggregationFactory):
    model_aggregator = factory_utils.as_weighted_aggregator(model_aggregator)
    client_weighting = tff.learning.ClientWeighting.UNIFORM
  elif not isinstance(model_aggregator, tff.aggregators.WeightedAggregationFactory):
    raise ValueError(
        'model_aggregator must be None or a tff.aggregators '
        f'(Un)WeightedAggregationFactory, got {model_aggregator!r}')
  seed_value = regeneration.seed_tensor(seed)
  plan = plan_freezing(keras_model_fn, list(frozen_layers), frozen_initializer)
  frozen_layers = plan.frozen_layers

  def full_model_fn():
    return tff.learning.models.from_keras_model(
        keras_model_fn(), loss=loss_fn(), input_spec=input_spec, metrics=metrics_fn())

  def client_model_fn():
    keras_model = keras_model_fn()
    freeze_layers(keras_model, frozen_layers)
    return tff.learning.models.from_keras_model(
        keras_model, loss=loss_fn(), input_spec=input_spec, metrics=metrics_fn())

  full_weights_type = tff.learning.models.weights_type_from_model(full_model_fn)

  @tff.tensorflow.computation
  def initial_model_weights_fn():
    full = tff.learning.models.ModelWeights.from_model(full_model_fn())
    return server_model_weights(plan, full, tf.constant(seed_value))

  server_weights_type = initial_model_weights_fn.type_signature.result
  distributor = tff.learning.templates.build_broadcast_process(server_weights_type)
  client_work = _build_client_work(
      plan, server_weights_type, client_model.zero_initialized(client_model_fn),
      client_optimizer_fn, client_weighting, metrics_aggregator, loop_implementation)
  aggregator = model_aggregator.create(
      server_weights_type.trainable, tff.TensorType(np.float32))
  finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
      server_optimizer_fn, server_weights_type)
  composed = tff.learning.templates.compose_learning_process(
      initial_model_weights_fn, distributor, client_work, aggregator, finalizer)

  state_type = composed.next.type_signature.parameter[0].member

  @tff.tensorflow.computation(state_type)
  def get_model_weights(state):
    return full_model_weights(plan, state.global_model_weights)

  @tff.tensorflow.computation(state_type, full_weights_type)
  def set_model_weights(state, model_weights):
    seed_tensor = state.global_model_weights.non_trainable[0]
    return tff.learning.templates.LearningAlgorithmState(
        global_model_weights=server_model_weights(plan, model_weights, seed_tensor),
        distributor=state.distributor,
        client_work=state.client_work,
        aggregator=state.aggregator,
        finalizer=state.finalizer)

  return tff.learning.templates.LearningProcess(
      composed.initialize, composed.next,
      get_model_weights=get_model_weights,
      set_model_weights=set_model_weights,
      get_hparams_fn=composed.get_hparams,
      set_hparams_fn=composed.set_hparams)
