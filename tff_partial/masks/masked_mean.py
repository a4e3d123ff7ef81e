"""Masked weighted mean: each variable averaged over the clients that trained it.

PVT (Yang et al., *Partial Variable Training for Efficient On-Device Federated
Learning*, Fig. 1): the server updates every variable with the changes of the
clients that trained it. `MaskedMeanFactory` is a
`tff.aggregators.WeightedAggregationFactory` built like
`tff.aggregators.MeanFactory`: it wraps two inner unweighted *sum* factories
(default `tff.aggregators.SumFactory`; a secure or DP sum plugs in the same
way) and divides.

Value type (what one client contributes):
  `<update=U, mask=float32[n]>`, where `U` is a structure of `n` tensors (the
  model update, TFF order) and `mask[i]` is 1 when the client trained the
  `i`-th tensor and 0 when it froze it.
Weight type: `float32` (number of examples, or 1 for uniform weighting).

For every tensor `i` of the round's clients `c` with weight `w_c`:
  `mean_i = sum_c w_c mask_ci update_ci / sum_c w_c mask_ci`,
and `mean_i = 0` when nobody trained it (never a division by zero; the
finalizer of `process.build_pvt_process` then keeps such a variable unchanged,
whatever the server optimizer).

Federated type signature of `next`:
  `(<S@SERVER, {<update=U, mask=float32[n]>}@CLIENTS, {float32}@CLIENTS> ->
    <state=S@SERVER, result=<update=U, trained=bool[n]>@SERVER,
     measurements=<mean_value=M1, mean_weight=M2,
                   clients_per_variable=int32[n]>@SERVER>)`
`clients_per_variable[i]` is the exact number of clients that trained tensor
`i` (an integer sum of the masks).
"""

import collections
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_partial.privacy import statistics


def _check_value_type(value_type):
  if not (isinstance(value_type, tff.StructType)
          and set(n for n, _ in tff.structure.iter_elements(value_type))
          == {'update', 'mask'}):
    raise ValueError(
        'MaskedMeanFactory needs a value type <update=U, mask=float32[n]>, got '
        f'{value_type}')
  update_type, mask_type = value_type.update, value_type.mask
  leaves = tff.structure.flatten(update_type)
  n = len(leaves)
  if not all(isinstance(t, tff.TensorType) and np.issubdtype(t.dtype, np.floating)
             for t in leaves):
    raise ValueError(f'the update must be a structure of float tensors, got {update_type}')
  if not (isinstance(mask_type, tff.TensorType) and mask_type.dtype == np.float32
          and tuple(mask_type.shape) == (n,)):
    raise ValueError(
        f'the mask must be float32[{n}] (one entry per update tensor), got {mask_type}')
  return update_type, n


class MaskedMeanFactory(tff.aggregators.WeightedAggregationFactory):
  """Per-variable weighted mean over the clients that trained the variable."""

  statistic = statistics.WEIGHTED_MEAN

  def __init__(
      self,
      value_sum_factory: Optional[tff.aggregators.UnweightedAggregationFactory] = None,
      weight_sum_factory: Optional[tff.aggregators.UnweightedAggregationFactory] = None,
  ):
    """Inner factories must compute *sums* (as for `tff.aggregators.MeanFactory`).

    Factories known to compute something else are refused with a ValueError:
    a fixed-denominator mean (`tff.aggregators.DifferentiallyPrivateFactory`
    presets, `tff_partial.privacy.DPMeanFactory`: pass its `sum_factory`), a
    mean or a median (`tff_partial.masks.MaskedMedianFactory` is PVT's median).

    Args:
      value_sum_factory: sums `w * mask * update` over clients. Default
        `tff.aggregators.SumFactory()`.
      weight_sum_factory: sums the per-variable weights `w * mask` (float32[n])
        over clients. Default `tff.aggregators.SumFactory()`.
    """
    for name, f in (('value_sum_factory', value_sum_factory),
                    ('weight_sum_factory', weight_sum_factory)):
      if f is not None:
        # A fixed-denominator mean (TFF's DP presets, DPMeanFactory) or a
        # median here would be divided again by the per-variable weights.
        statistics.check_sum_factory(f, f'MaskedMeanFactory {name}')
    self._value_sum_factory = value_sum_factory or tff.aggregators.SumFactory()
    self._weight_sum_factory = weight_sum_factory or tff.aggregators.SumFactory()

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    update_type, n = _check_value_type(value_type)
    if not (isinstance(weight_type, tff.TensorType) and weight_type.dtype == np.float32
            and not weight_type.shape):
      raise ValueError(f'weight type must be float32 scalar, got {weight_type}')
    per_variable_weight_type = tff.TensorType(np.float32, [n])
    value_process = self._value_sum_factory.create(update_type)
    weight_process = self._weight_sum_factory.create(per_variable_weight_type)

    @tff.federated_computation()
    def init_fn():
      return tff.federated_zip(collections.OrderedDict(
          value_sum_process=value_process.initialize(),
          weight_sum_process=weight_process.initialize()))

    @tff.tensorflow.computation(value_type, weight_type)
    def weigh(value, weight):
      # `weight * mask` first, then times the update: with a mask of ones this
      # is bit-identical to MeanFactory's `update * weight`.
      per_variable = value['mask'] * weight
      flat = tf.nest.flatten(value['update'])
      weighted = [t * tf.cast(per_variable[i], t.dtype) for i, t in enumerate(flat)]
      return (tf.nest.pack_sequence_as(value['update'], weighted),
              per_variable,
              tf.cast(value['mask'] > 0, tf.int32))

    @tff.tensorflow.computation(update_type, per_variable_weight_type)
    def divide(value_sum, weight_sum):
      flat = tf.nest.flatten(value_sum)
      means = [tf.math.divide_no_nan(t, tf.cast(weight_sum[i], t.dtype))
               for i, t in enumerate(flat)]
      return collections.OrderedDict(
          update=tf.nest.pack_sequence_as(value_sum, means),
          trained=weight_sum > 0)

    @tff.federated_computation(
        init_fn.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      weighted, per_variable, trained = tff.federated_map(weigh, (value, weight))
      value_out = value_process.next(state['value_sum_process'], weighted)
      weight_out = weight_process.next(state['weight_sum_process'], per_variable)
      result = tff.federated_map(divide, (value_out.result, weight_out.result))
      new_state = tff.federated_zip(collections.OrderedDict(
          value_sum_process=value_out.state, weight_sum_process=weight_out.state))
      measurements = tff.federated_zip(collections.OrderedDict(
          mean_value=value_out.measurements,
          mean_weight=weight_out.measurements,
          clients_per_variable=tff.federated_sum(trained)))
      return tff.templates.MeasuredProcessOutput(new_state, result, measurements)

    return tff.templates.AggregationProcess(init_fn, next_fn)
