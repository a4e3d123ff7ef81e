"""Deselect aggregation: per-client (keys, slice updates, weight) -> dense update.

Charles et al., *Federated Select* (2022), sec. 4, eq. (5): the server applies
a deselection function `phi(u_n, z_n)` that scatters client n's sub-model
update back to the places its keys name. Here every key gets the weighted mean
of the updates of the clients that selected it (per-key weighted sum divided by
per-key weight); a key nobody selected gets a zero update (unchanged under a
plain SGD server step); the variables broadcast in full get the ordinary
weighted mean.

Client value (one upload per client):
  `OrderedDict(keys=<group: int32[m]>, slices=<group: <[m, *slice]...>>,
               broadcast=<dense deltas of broadcast variables...>)`
Federated type of `next`:
  `(<S@SERVER, {U}@CLIENTS, {float32}@CLIENTS> -> <state=S@SERVER,
     result=<dense trainable update...>@SERVER, measurements=M@SERVER>)`

Two ways to sum, like `tff.aggregators.MeanFactory` wrapping `SumFactory`:
* default (no inner factories): `federated_aggregate` whose accumulator is the
  dense server-side update; clients send only keys and slices (the sparse
  aggregation of sec. 4.2, and what `comm.client_bytes` then counts up);
* `value_sum_factory` / `weight_sum_factory` given (e.g. a secure or DP sum):
  each client scatters its update into the dense model shape (zeros at keys it
  did not select) and the inner factories sum dense values and per-key
  weights. Sec. 4.2 explains why: privacy-preserving sums are dense; clients
  then upload dense tensors and the bytes say so.

* `DeselectMeanFactory.paper_mean(spec, mean_factory)`: each client scatters
  its (unweighted) update into the dense model shape and any TFF mean factory
  (weighted or unweighted: `MeanFactory`, DP-FedAvg's Gaussian mean, DP-FTRL's
  tree mean, a median) averages those over clients: exactly the paper's
  eq. (5), `(1/N) sum_n phi(u_n, z_n)`, with no per-key normalisation, so a
  DP mechanism clips and noises each client's whole dense update and no
  per-key counts (which reveal keys) are released. This is how the training
  binary plugs `--aggregator` into federated select.

The scatter-add itself is hand-written (TFF has no deselect primitive).
"""

import collections
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_partial.privacy import median
from tff_partial.privacy import statistics
from tff_partial.select import slicing


def upload_type(spec: slicing.SelectSpec, dtype=None):
  """The TFF type of one client's upload (see module docstring)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  dtype = dtype or np.float32
  keys = collections.OrderedDict(
      (g.name, tff.TensorType(np.int32, [g.keys_per_client])) for g in spec.groups)
  slices = collections.OrderedDict(
      (g.name, tuple(tff.TensorType(dtype, [g.keys_per_client] + list(s.slice_shape(g.bucket_size)))
                     for s in g.slices)) for g in spec.groups)
  broadcast = tuple(tff.TensorType(dtype, list(spec.trainable_shapes[i]))
                    for i in spec.broadcast_indices)
  return tff.StructWithPythonType([('keys', keys), ('slices', slices), ('broadcast', broadcast)],
                                  collections.OrderedDict)


def _check_upload_type(name, spec, value_type):
  expected = upload_type(spec)
  if not expected.is_assignable_from(value_type):
    raise TypeError(f'{name}: value type {value_type} is not the upload type of '
                    f'the select spec {expected}')


def _zero_accumulator(spec):
  views = collections.OrderedDict(
      (g.name, tuple(tf.zeros([g.num_keys] + list(s.slice_shape(g.bucket_size)))
                     for s in g.slices)) for g in spec.groups)
  counts = collections.OrderedDict(
      (g.name, tf.zeros([g.num_keys])) for g in spec.groups)
  broadcast = tuple(tf.zeros(spec.trainable_shapes[i]) for i in spec.broadcast_indices)
  return collections.OrderedDict(views=views, counts=counts, broadcast=broadcast,
                                 weight=tf.constant(0.0))


def scatter_upload(spec, upload, weight):
  """phi(u_n, z_n) for one client, weighted: the dense accumulator of it."""
  views = collections.OrderedDict()
  counts = collections.OrderedDict()
  for g in spec.groups:
    views[g.name], counts[g.name] = slicing.scatter_to_views(
        spec, g, upload['keys'][g.name], upload['slices'][g.name], weight)
  broadcast = tuple(weight * b for b in upload['broadcast'])
  return collections.OrderedDict(views=views, counts=counts, broadcast=broadcast,
                                 weight=tf.cast(weight, tf.float32))


def _add(a, b):
  return tf.nest.map_structure(tf.add, a, b)


def finalize_dense(spec, acc):
  """Accumulated sums -> the dense update in `model.trainable_weights` order."""
  out = [None] * spec.num_trainable
  for g in spec.groups:
    counts = acc['counts'][g.name]
    means = []
    for v in acc['views'][g.name]:
      c = tf.reshape(counts, [-1] + [1] * (len(v.shape) - 1))
      means.append(tf.math.divide_no_nan(v, c))
    for s, var in zip(g.slices, slicing.views_to_variables(spec, g, means)):
      out[s.index] = var
  for i, b in zip(spec.broadcast_indices, acc['broadcast']):
    out[i] = tf.math.divide_no_nan(b, acc['weight'])
  return out


class DeselectMeanFactory(tff.aggregators.WeightedAggregationFactory):
  """Per-key weighted mean of deselected client updates.

  Args:
    spec: the model's `slicing.SelectSpec`.
    value_sum_factory: optional `tff.aggregators.UnweightedAggregationFactory`
      summing the clients' dense (scattered, weighted) updates; None sums the
      sparse uploads with `federated_aggregate`.
    weight_sum_factory: optional factory summing the per-key weights (and the
      total weight); defaults to `tff.aggregators.SumFactory` when
      `value_sum_factory` is given.
  """

  statistic = statistics.WEIGHTED_MEAN

  def __init__(self, spec: slicing.SelectSpec,
               value_sum_factory: Optional[tff.aggregators.UnweightedAggregationFactory] = None,
               weight_sum_factory: Optional[tff.aggregators.UnweightedAggregationFactory] = None):
    for name, f in (('value_sum_factory', value_sum_factory),
                    ('weight_sum_factory', weight_sum_factory)):
      if f is not None:  # divided by per-key weights: must be a sum
        statistics.check_sum_factory(f, f'DeselectMeanFactory {name}')
    self._spec = spec
    self._value_sum_factory = value_sum_factory
    if value_sum_factory is not None and weight_sum_factory is None:
      weight_sum_factory = tff.aggregators.SumFactory()
    self._weight_sum_factory = weight_sum_factory

  @classmethod
  def paper_mean(cls, spec, mean_factory):
    """Eq. (5) with `mean_factory` averaging clients' dense phi(u_n, z_n).

    `mean_factory` must compute a mean over the N clients (TFF's
    `MeanFactory`, a DP fixed-denominator mean such as
    `tff_partial.privacy.DPMeanFactory`); a median of zero-filled dense
    updates is refused (a key chosen by fewer than half of the clients would
    get 0): use `DeselectMedianFactory`.
    """
    statistic = statistics.statistic_of(mean_factory)
    if statistic not in (statistics.FIXED_DENOMINATOR_MEAN, statistics.WEIGHTED_MEAN,
                         statistics.MEAN, None):
      raise ValueError(
          f'DeselectMeanFactory.paper_mean needs a mean factory; '
          f'{type(mean_factory).__name__} computes a {statistic}'
          + (' (use DeselectMedianFactory)' if statistic == statistics.MEDIAN else ''))
    factory = cls(spec)
    factory._mean_factory = mean_factory  # pylint: disable=protected-access
    return factory

  _mean_factory = None

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    spec = self._spec
    _check_upload_type('DeselectMeanFactory', spec, value_type)
    if self._mean_factory is not None:
      return self._create_paper_mean(value_type, weight_type)
    if self._value_sum_factory is None:
      return self._create_sparse(value_type, weight_type)
    return self._create_dense(value_type, weight_type)

  def _create_sparse(self, value_type, weight_type):
    spec = self._spec

    @tff.tensorflow.computation
    def zero():
      return _zero_accumulator(spec)

    acc_type = zero.type_signature.result

    @tff.tensorflow.computation(acc_type, tff.StructType([value_type, weight_type]))
    def accumulate(acc, value_and_weight):
      upload, weight = value_and_weight
      return _add(acc, scatter_upload(spec, upload, weight))

    @tff.tensorflow.computation(acc_type, acc_type)
    def merge(a, b):
      return _add(a, b)

    @tff.tensorflow.computation(acc_type)
    def report(acc):
      return finalize_dense(spec, acc)

    @tff.federated_computation
    def init_fn():
      return tff.federated_value((), tff.SERVER)

    @tff.federated_computation(init_fn.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS),
                               tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      dense = tff.federated_aggregate(
          tff.federated_zip((value, weight)), zero(), accumulate, merge, report)
      return tff.templates.MeasuredProcessOutput(
          state=state, result=dense,
          measurements=tff.federated_value((), tff.SERVER))

    return tff.templates.AggregationProcess(init_fn, next_fn)

  def _create_dense(self, value_type, weight_type):
    spec = self._spec

    @tff.tensorflow.computation(value_type, weight_type)
    def scatter(upload, weight):
      acc = scatter_upload(spec, upload, weight)
      return (collections.OrderedDict(views=acc['views'], broadcast=acc['broadcast']),
              collections.OrderedDict(counts=acc['counts'], weight=acc['weight']))

    values_type, weights_type = scatter.type_signature.result
    value_sum = self._value_sum_factory.create(values_type)
    weight_sum = self._weight_sum_factory.create(weights_type)

    @tff.tensorflow.computation(values_type, weights_type)
    def report(values, weights):
      acc = collections.OrderedDict(views=values['views'], broadcast=values['broadcast'],
                                    counts=weights['counts'], weight=weights['weight'])
      return finalize_dense(spec, acc)

    @tff.federated_computation
    def init_fn():
      return tff.federated_zip(collections.OrderedDict(
          value_sum=value_sum.initialize(), weight_sum=weight_sum.initialize()))

    @tff.federated_computation(init_fn.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS),
                               tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      dense_values, dense_weights = tff.federated_map(scatter, (value, weight))
      values_out = value_sum.next(state.value_sum, dense_values)
      weights_out = weight_sum.next(state.weight_sum, dense_weights)
      result = tff.federated_map(report, (values_out.result, weights_out.result))
      new_state = tff.federated_zip(collections.OrderedDict(
          value_sum=values_out.state, weight_sum=weights_out.state))
      measurements = tff.federated_zip(collections.OrderedDict(
          value_sum=values_out.measurements, weight_sum=weights_out.measurements))
      return tff.templates.MeasuredProcessOutput(new_state, result, measurements)

    return tff.templates.AggregationProcess(init_fn, next_fn)

  def _create_paper_mean(self, value_type, weight_type):
    spec = self._spec

    @tff.tensorflow.computation(value_type)
    def scatter(upload):
      acc = scatter_upload(spec, upload, tf.constant(1.0))
      acc['counts'] = collections.OrderedDict(
          (g.name, tf.ones([g.num_keys])) for g in spec.groups)
      acc['weight'] = tf.constant(1.0)
      return finalize_dense(spec, acc)

    dense_type = scatter.type_signature.result
    weighted = isinstance(self._mean_factory, tff.aggregators.WeightedAggregationFactory)
    mean = (self._mean_factory.create(dense_type, weight_type) if weighted
            else self._mean_factory.create(dense_type))

    @tff.federated_computation
    def init_fn():
      return mean.initialize()

    @tff.federated_computation(init_fn.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS),
                               tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      dense = tff.federated_map(scatter, value)
      out = mean.next(state, dense, weight) if weighted else mean.next(state, dense)
      return tff.templates.MeasuredProcessOutput(out.state, out.result, out.measurements)

    return tff.templates.AggregationProcess(init_fn, next_fn)


class DeselectMedianFactory(tff.aggregators.WeightedAggregationFactory):
  """Per-key coordinate-wise median over the clients that chose the key.

  The coordinate-wise median (Yin et al. 2018) composed with deselection: for
  a key `k` of a group, each coordinate of its slices gets the median over the
  clients whose keys include `k` (a median of zero-filled dense updates would
  count the zeros of the other clients, so a key chosen by fewer than half of
  the round's clients would get 0 and never train); a key nobody chose gets a
  zero update. The broadcast variables get the median over all clients.

  Unweighted (the client weight is accepted and ignored, as for
  `tff_partial.privacy.CoordinateMedianFactory`). Hand-written on
  `tff.federated_aggregate`: the server stacks every client's scattered
  (dense) update and key indicator, memory O(clients x model), a simulation.

  Federated type of `next`:
    `(<<>@SERVER, {U}@CLIENTS, {float32}@CLIENTS> -> <state=<>@SERVER,
       result=<dense trainable update...>@SERVER, measurements=<>@SERVER>)`
  """

  statistic = statistics.MEDIAN

  def __init__(self, spec: slicing.SelectSpec):
    self._spec = spec

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    spec = self._spec
    _check_upload_type('DeselectMedianFactory', spec, value_type)

    def rows(upload):
      """One client's dense tensors: views, key indicators, broadcast (flat)."""
      acc = scatter_upload(spec, upload, tf.constant(1.0))
      views = [v for g in spec.groups for v in acc['views'][g.name]]
      counts = [acc['counts'][g.name] for g in spec.groups]
      return views + counts + list(acc['broadcast'])

    def report(stacks):
      stacks = list(stacks)
      views_stack = collections.OrderedDict()
      for g in spec.groups:
        views_stack[g.name] = tuple(stacks.pop(0) for _ in g.slices)
      counts_stack = collections.OrderedDict((g.name, stacks.pop(0)) for g in spec.groups)
      out = [None] * spec.num_trainable
      for g in spec.groups:
        chose = counts_stack[g.name] > 0  # [N, num_keys]
        medians = []
        for v in views_stack[g.name]:
          present = tf.reshape(chose, [-1, g.num_keys] + [1] * (len(v.shape) - 2))
          medians.append(median.masked_median(v, present))
        for sl, var in zip(g.slices, slicing.views_to_variables(spec, g, medians)):
          out[sl.index] = var
      for i, b in zip(spec.broadcast_indices, stacks):
        out[i] = median.masked_median(b)
      return out

    return median.build_stacking_process(value_type, rows, report, weight_type)
