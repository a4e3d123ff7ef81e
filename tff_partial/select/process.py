"""Model training with federated select: Algorithm 2 of Charles et al. (2022).

Per round, each sampled client
  1. sends its select keys z_n (one int32[m] per key space / group),
  2. receives the slices they name via `tff.federated_select` (one call per
     group; the server value is the group's variables viewed key-major) plus
     the small variables by `tff.federated_broadcast`,
  3. assembles its sub-model (the task's Keras model with the selected layers
     narrowed, `slicing.build_client_keras_model`), remaps its data to it
     (token ids / features / labels to local indices) and trains it with
     TFF's model-delta client work,
  4. uploads (keys, slice updates, broadcast-variable updates, weight);
the server deselects them (`aggregator.DeselectMeanFactory`: per-key weighted
means) and applies the server optimizer (TFF's apply-optimizer finalizer).

Federated type of `next`:
  (<state=LearningAlgorithmState@SERVER,
    client_data={<data=D*, keys=<group: int32[m]>>}@CLIENTS>
   -> <state@SERVER, metrics@SERVER>)
The state and metrics have FedAvg's shape (`LearningAlgorithmState`;
metrics `distributor / client_work / aggregator / finalizer`), and
`get_model_weights(state)` returns the full server model.

How the selected slices reach the clients in simulation
(`implementation`): with TFF's `tff.federated_select` intrinsic, the C++
runtime calls the select function once per distinct key and hands every
client its slices as a sequence it materializes and re-reads, which took
4-30x a broadcast of the same payload for 1,000 rows per client
(`tff_partial.select.bench`, `scripts.benchmark --benchmark_select_buckets`).
`broadcast_gather` computes the same select the way the paper's
implementation option 1 does (section 3.2, "broadcast and compute on
clients"): the group's server value is broadcast and each client gathers the
slices of its keys (`slicing.select_key` with all its keys at once). Every
client gets exactly the values `federated_select` would give it, in a time
close to a broadcast of its payload (TFF's runtime shares one broadcast
value among clients). What a deployed select sends (only the selected
slices) is described by the `federated_select` form, whose `next` is built
alongside (`build_federated_select_process_and_traffic`) for exact bytes.

Why not `tff.learning.templates.compose_learning_process`: its distributor
sees only server values, while the select distributor needs the clients'
keys; the process is therefore composed here from the same TFF parts
(client work, finalizer) around a select distributor and the deselect
aggregator.
"""

import collections
from typing import Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_partial.select import aggregator as aggregator_lib
from tff_partial.select import slicing
from tff_partial.training import client_model

FEDERATED_SELECT = 'federated_select'
BROADCAST_GATHER = 'broadcast_gather'
AUTO = 'auto'
IMPLEMENTATIONS = (AUTO, BROADCAST_GATHER, FEDERATED_SELECT)


def resolve_implementation(implementation: str, spec: slicing.SelectSpec) -> str:
  """`auto`: `broadcast_gather` (measured faster for every key count, from
  1 to 1,000 keys per client), else the implementation asked for."""
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f'--select_implementation={implementation!r}; valid values: '
                     + ', '.join(IMPLEMENTATIONS))
  del spec
  return BROADCAST_GATHER if implementation == AUTO else implementation


def _sub_model_fn(keras_model_fn, loss_fn, metrics_fn, input_spec, spec):
  sub_spec = slicing.client_input_spec(input_spec, spec)

  def model_fn():
    return tff.learning.models.from_keras_model(
        keras_model=slicing.build_client_keras_model(keras_model_fn, spec),
        loss=loss_fn(), input_spec=sub_spec, metrics=metrics_fn())

  return model_fn


def build_federated_select_process(*args, **kwargs
                                   ) -> tff.learning.templates.LearningProcess:
  """Builds Algorithm 2 as a `tff.learning.templates.LearningProcess`.

  Takes the arguments of `build_federated_select_process_and_traffic` and
  returns its process.
  """
  return build_federated_select_process_and_traffic(*args, **kwargs)[0]


def build_federated_select_process_and_traffic(
    keras_model_fn: Callable[[], tf.keras.Model],
    loss_fn: Callable[[], tf.keras.losses.Loss],
    metrics_fn: Callable[[], list],
    input_spec,
    spec: slicing.SelectSpec,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    *,
    deselect_factory: Optional[tff.aggregators.WeightedAggregationFactory] = None,
    client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE),
    implementation: str = AUTO,
) -> tuple[tff.learning.templates.LearningProcess, tff.Computation]:
  """Algorithm 2 as a `LearningProcess`, and the `next` of its select form.

  Args:
    keras_model_fn: no-arg function returning the server's (uncompiled) Keras
      model; its layers must carry the names used in `spec`.
    loss_fn, metrics_fn: no-arg functions returning the Keras loss / metrics.
    input_spec: element spec of a client's (preprocessed, batched) dataset.
    spec: `slicing.make_select_spec(keras_model_fn(), groups)`.
    client_optimizer, server_optimizer: `tff.learning.optimizers.Optimizer`s.
    deselect_factory: the aggregator of client uploads; defaults to
      `aggregator.DeselectMeanFactory(spec)` (sparse per-key weighted mean).
    client_weighting: `tff.learning.ClientWeighting` of the client work.
    loop_implementation: the clients' `tff.learning.LoopImplementation`.
    implementation: how slices reach the clients in simulation:
      `federated_select` (TFF's intrinsic), `broadcast_gather` (the same
      values via a broadcast and a gather at each client; the paper's option
      1) or `auto` (`resolve_implementation`).

  Returns:
    (process, traffic_next): the `LearningProcess` (clients' `next` input is
    `OrderedDict(data=dataset, keys=OrderedDict(group=int32[m]))`), and the
    `next` computation of the `federated_select` form (the process's own
    `next` when it is that form): its type and intrinsics describe what a
    deployed select sends (`tff_partial.measure.comm.client_bytes`).
  """
  implementation = resolve_implementation(implementation, spec)
  if not spec.groups:
    raise ValueError('spec: federated select needs at least one select group')
  if deselect_factory is None:
    deselect_factory = aggregator_lib.DeselectMeanFactory(spec)

  def full_model_fn():
    return tff.learning.models.from_keras_model(
        keras_model=keras_model_fn(), loss=loss_fn(), input_spec=input_spec,
        metrics=metrics_fn())

  sub_model_fn = _sub_model_fn(keras_model_fn, loss_fn, metrics_fn, input_spec, spec)
  full_weights_type = tff.learning.models.weights_type_from_model(full_model_fn)
  sub_weights_type = tff.learning.models.weights_type_from_model(sub_model_fn)
  data_type = tff.SequenceType(tff.types.tensorflow_to_type(input_spec))
  keys_type = tff.StructWithPythonType(
      [(g.name, tff.TensorType(np.int32, [g.keys_per_client])) for g in spec.groups],
      collections.OrderedDict)
  client_data_type = tff.StructWithPythonType([('data', data_type), ('keys', keys_type)],
                                    collections.OrderedDict)
  if len(sub_weights_type.trainable) != spec.num_trainable:
    raise ValueError('the client sub-model does not have the server model\'s '
                     'trainable variables; check the select spec')

  client_work = tff.learning.templates.build_model_delta_client_work(
      client_model.zero_initialized(sub_model_fn), client_optimizer, client_weighting,
      loop_implementation=loop_implementation)
  finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
      server_optimizer, full_weights_type)
  upload_type = aggregator_lib.upload_type(spec)
  deselect = deselect_factory.create(upload_type, tff.TensorType(np.float32))

  @tff.tensorflow.computation
  def initial_weights():
    model = full_model_fn()
    return tff.learning.models.ModelWeights.from_model(model)

  # psi: the server value of each group and its select function.
  view_fns, select_fns, max_keys = {}, {}, {}

  def make_select_fns(g):
    @tff.tensorflow.computation(full_weights_type.trainable)
    def views(trainable):
      return slicing.server_views(spec, g, list(trainable))

    @tff.tensorflow.computation(views.type_signature.result, np.int32)
    def select_fn(server_views, key):
      return slicing.select_key(server_views, key)

    return views, select_fn

  for g in spec.groups:
    view_fns[g.name], select_fns[g.name] = make_select_fns(g)
    max_keys[g.name] = g.num_keys - 1

  @tff.tensorflow.computation(full_weights_type)
  def broadcast_part(weights):
    return (tuple(weights.trainable[i] for i in spec.broadcast_indices),
            tuple(weights.non_trainable))

  selected_types = collections.OrderedDict(
      (g.name, tff.SequenceType(select_fns[g.name].type_signature.result))
      for g in spec.groups)

  def assemble_sub_weights(stacked_by_group, broadcast):
    trainable = [None] * spec.num_trainable
    for g in spec.groups:
      for s, v in zip(g.slices, slicing.assemble(spec, g, stacked_by_group[g.name])):
        trainable[s.index] = v
    for i, v in zip(spec.broadcast_indices, broadcast[0]):
      trainable[i] = v
    return tff.learning.models.ModelWeights(
        trainable=trainable, non_trainable=list(broadcast[1]))

  @tff.tensorflow.computation(tff.StructType(list(selected_types.items())),
                              broadcast_part.type_signature.result)
  def assemble(selected, broadcast):
    return assemble_sub_weights(collections.OrderedDict(
        (g.name, selected[g.name].batch(g.keys_per_client).get_single_element())
        for g in spec.groups), broadcast)

  views_types = tff.StructWithPythonType(
      [(g.name, view_fns[g.name].type_signature.result) for g in spec.groups],
      collections.OrderedDict)

  @tff.tensorflow.computation(views_types, keys_type,
                              broadcast_part.type_signature.result)
  def gather_and_assemble(views, keys, broadcast):
    # psi of all of a client's keys at once: [m, *slice_shape] per slice.
    stacked = collections.OrderedDict(
        (g.name, slicing.select_key(tuple(views[g.name]), keys[g.name]))
        for g in spec.groups)
    return assemble_sub_weights(stacked, broadcast)

  @tff.tensorflow.computation(client_data_type)
  def client_dataset(client_data):
    return slicing.client_dataset(spec, client_data['keys'], client_data['data'])

  @tff.tensorflow.computation(sub_weights_type.trainable, keys_type)
  def make_upload(update, keys):
    update = list(update)
    slices = collections.OrderedDict()
    for g in spec.groups:
      slices[g.name] = slicing.disassemble(
          spec, g, [update[s.index] for s in g.slices])
    return collections.OrderedDict(
        keys=keys, slices=slices,
        broadcast=tuple(update[i] for i in spec.broadcast_indices))

  @tff.federated_computation
  def init_fn():
    return tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        global_model_weights=tff.federated_eval(initial_weights, tff.SERVER),
        distributor=tff.federated_value((), tff.SERVER),
        client_work=client_work.initialize(),
        aggregator=deselect.initialize(),
        finalizer=finalizer.initialize()))

  state_type = init_fn.type_signature.result

  def sub_weights_at_clients(weights, keys, how):
    """The clients' sub-models: the selected slices + the broadcast part."""
    broadcast = tff.federated_broadcast(tff.federated_map(broadcast_part, weights))
    server_vals = collections.OrderedDict(
        (g.name, tff.federated_map(view_fns[g.name], weights.trainable))
        for g in spec.groups)
    if how == BROADCAST_GATHER:
      views = tff.federated_zip(collections.OrderedDict(
          (name, tff.federated_broadcast(v)) for name, v in server_vals.items()))
      return tff.federated_map(gather_and_assemble, (views, keys, broadcast))
    selected = collections.OrderedDict(
        (g.name, tff.federated_select(
            keys[g.name], tff.federated_value(max_keys[g.name], tff.SERVER),
            server_vals[g.name], select_fns[g.name]))
        for g in spec.groups)
    return tff.federated_map(assemble, (tff.federated_zip(selected), broadcast))

  def make_next(how):
    @tff.federated_computation(state_type,
                               tff.FederatedType(client_data_type, tff.CLIENTS))
    def next_fn(state, client_data):
      return round_body(state, client_data, how)
    return next_fn

  def round_body(state, client_data, how):
    weights = state.global_model_weights
    keys = client_data['keys']
    sub_weights = sub_weights_at_clients(weights, keys, how)
    data = tff.federated_map(client_dataset, client_data)
    work = client_work.next(state.client_work, sub_weights, data)
    uploads = tff.federated_map(make_upload, (work.result.update, keys))
    agg = deselect.next(state.aggregator, uploads, work.result.update_weight)
    fin = finalizer.next(state.finalizer, weights, agg.result)
    new_state = tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        global_model_weights=fin.result,
        distributor=state.distributor,
        client_work=work.state,
        aggregator=agg.state,
        finalizer=fin.state))
    metrics = tff.federated_zip(collections.OrderedDict(
        distributor=tff.federated_value((), tff.SERVER),
        client_work=work.measurements,
        aggregator=agg.measurements,
        finalizer=fin.measurements))
    return tff.learning.templates.LearningProcessOutput(new_state, metrics)

  state_member = state_type.member

  @tff.tensorflow.computation(state_member)
  def get_model_weights(state):
    return state.global_model_weights

  @tff.tensorflow.computation(state_member, state_member.global_model_weights)
  def set_model_weights(state, model_weights):
    return tff.learning.templates.LearningAlgorithmState(
        global_model_weights=model_weights,
        distributor=state.distributor,
        client_work=state.client_work,
        aggregator=state.aggregator,
        finalizer=state.finalizer)

  next_fn = make_next(implementation)
  traffic_next = (next_fn if implementation == FEDERATED_SELECT
                  else make_next(FEDERATED_SELECT))
  process = tff.learning.templates.LearningProcess(
      init_fn, next_fn, get_model_weights, set_model_weights)
  return process, traffic_next


def client_input(dataset, keys) -> collections.OrderedDict:
  """The value `next` takes for one client."""
  return collections.OrderedDict(data=dataset, keys=keys)
