"""Coordinate-wise median aggregation (robust to a minority of bad clients).

Yin, Chen, Ramchandran, Bartlett (2018), "Byzantine-Robust Distributed Learning:
Towards Optimal Statistical Rates", https://arxiv.org/abs/1803.01498; compared
with FedAvg in "Salvaging Federated Learning by Local Adaptation".

TFF 0.87 has no median aggregator, so this one is hand-written on
`tff.federated_aggregate` (`build_stacking_process`, shared with PVT's and
federated select's medians): each client's value is appended to a stack of
shape `[None, *shape]` per tensor, and the server reports, per coordinate, the
median over clients (the mean of the two middle values for an even count).

Federated type for a value type `V` (unweighted):
  initialize: `( -> <>@SERVER)`
  next: `(<<>@SERVER, {V}@CLIENTS> -> <state=<>@SERVER, result=V@SERVER,
          measurements=<>@SERVER>)`
The stack grows with the number of clients: memory O(clients x model) at the
aggregator, fine for simulation, not meant for production-scale cohorts.
"""

import tensorflow as tf
import tensorflow_federated as tff
# Private TFF helper (also used by tff.aggregators.DifferentiallyPrivateFactory).
from tensorflow_federated.python.core.impl.types import type_conversions

from tff_partial.privacy import statistics


def masked_median(stack: tf.Tensor, present=None) -> tf.Tensor:
  """Per coordinate, the median over axis 0 of the entries that are `present`.

  Args:
    stack: `[N, *shape]` values of N clients.
    present: bool, broadcastable to `stack`'s shape: which clients hold each
      coordinate (PVT: trained the variable; select: chose the key). None:
      all of them.

  Returns:
    `[*shape]`: the median of the present values (the mean of the two middle
    ones for an even count), and 0 where no client is present.
  """
  if present is None:
    present = tf.ones_like(stack, tf.bool)
  present = tf.broadcast_to(present, tf.shape(stack))
  # Absent entries sort last (+inf); the median then sits at the positions
  # (c-1)//2 and c//2 of the c present ones.
  ordered = tf.sort(tf.where(present, stack, tf.cast(float('inf'), stack.dtype)), axis=0)
  count = tf.reduce_sum(tf.cast(present, tf.int32), axis=0)
  last = tf.maximum(count - 1, 0)

  def at(position):  # ordered[position[j], j] for every coordinate j
    return tf.experimental.numpy.take_along_axis(ordered, position[tf.newaxis], axis=0)[0]

  low, high = at(last // 2), at(tf.minimum(count // 2, last))
  median = (low + high) / tf.cast(2, ordered.dtype)
  result = tf.where(count > 0, median, tf.zeros_like(median))
  result.set_shape(stack.shape[1:])  # take_along_axis loses the static shape
  return result


def _flat(value):
  if isinstance(value, tff.structure.Struct):
    return tff.structure.flatten(value)
  return tf.nest.flatten(value)


def build_stacking_process(value_type, rows_fn, report_fn, weight_type=None,
                           measure_fn=None) -> tff.templates.AggregationProcess:
  """A stateless process whose server stacks every client's rows, then reports.

  The shared skeleton of the medians here and in `masks` / `select` (TFF has
  no median): `tff.federated_aggregate` appends each client's
  `rows_fn(value)` (a list of tensors) to stacks of shape `[None, *row]`, and
  the server returns `report_fn(stacks)` (the list of `[N, *row]` tensors).
  Memory O(clients x rows) at the aggregator: fine for simulation, not meant
  for production-scale cohorts.

  Args:
    value_type: the clients' value type.
    rows_fn: TF function of one client's value -> list of tensors.
    report_fn: TF function of the list of stacks -> the result.
    weight_type: None for an unweighted process; else the weight type of a
      weighted one, whose weights are ignored (a median is unweighted).
    measure_fn: federated function of the clients' values -> measurements
      at SERVER; None: no measurements.

  Federated type of `next`: `(<<>@SERVER, {V}@CLIENTS[, {W}@CLIENTS]> ->
  <state=<>@SERVER, result=R@SERVER, measurements=M@SERVER>)`.
  """

  @tff.tensorflow.computation(value_type)
  def rows(value):
    return rows_fn(value)

  row_types = tff.structure.flatten(rows.type_signature.result)
  stack_type = tff.types.StructWithPythonType(
      [tff.TensorType(t.dtype, [None] + list(t.shape)) for t in row_types], list)

  @tff.tensorflow.computation
  def zeros():
    return [tf.zeros([0] + list(t.shape), t.dtype) for t in row_types]

  @tff.tensorflow.computation(stack_type, value_type)
  def accumulate(stack, value):
    return [tf.concat([s, r[tf.newaxis]], 0) for s, r in zip(_flat(stack), rows_fn(value))]

  @tff.tensorflow.computation(stack_type, stack_type)
  def merge(a, b):
    return [tf.concat([x, y], 0) for x, y in zip(_flat(a), _flat(b))]

  @tff.tensorflow.computation(stack_type)
  def report(stack):
    return report_fn(list(_flat(stack)))

  @tff.federated_computation
  def init_fn():
    return tff.federated_value((), tff.SERVER)

  def output(state, value):
    result = tff.federated_aggregate(value, zeros(), accumulate, merge, report)
    measurements = (measure_fn(value) if measure_fn is not None
                    else tff.federated_value((), tff.SERVER))
    return tff.templates.MeasuredProcessOutput(state, result, measurements)

  value_at_clients = tff.FederatedType(value_type, tff.CLIENTS)
  if weight_type is None:
    @tff.federated_computation(init_fn.type_signature.result, value_at_clients)
    def next_fn(state, value):
      return output(state, value)
  else:
    @tff.federated_computation(init_fn.type_signature.result, value_at_clients,
                               tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      del weight  # a median is unweighted
      return output(state, value)

  return tff.templates.AggregationProcess(init_fn, next_fn)


class CoordinateMedianFactory(tff.aggregators.UnweightedAggregationFactory):
  """`UnweightedAggregationFactory` of the element-wise median of client values.

  A robust statistic (MEDIAN), not a sum: it cannot serve as the inner sum of
  a masked or per-key mean; PVT and federated select use their own medians
  over the clients that trained a variable / chose a key
  (`tff_partial.masks.MaskedMedianFactory`, `tff_partial.select.DeselectMedianFactory`).
  """

  statistic = statistics.MEDIAN

  def create(self, value_type) -> tff.templates.AggregationProcess:
    # TFF's DifferentiallyPrivateFactory uses the same conversion: it gives the
    # Python container structure that values of `value_type` arrive in.
    specs = type_conversions.type_to_tf_tensor_specs(value_type)
    for spec in tf.nest.flatten(specs):
      if not spec.dtype.is_floating:
        raise ValueError(
            f'the median aggregates floating-point tensors; got {spec.dtype} in {value_type}')

    def report(stacks):
      medians = [masked_median(s) for s in stacks]
      if isinstance(value_type, tff.TensorType):
        return medians[0]
      return tf.nest.pack_sequence_as(specs, medians)

    return build_stacking_process(value_type, _flat, report)


def build_median_factory() -> CoordinateMedianFactory:
  return CoordinateMedianFactory()
