"""Masked median: each coordinate's median over the clients that trained it.

PVT (Yang et al., *Partial Variable Training*) with the coordinate-wise median
of Yin et al. (2018) (`--aggregator=median`). A PVT client's update is zero on
the variables it froze; a median over all clients would count those zeros as
votes and pull every partly trained variable towards 0 (to exactly 0 when
fewer than half of the clients trained it). So the median of variable `i` is
taken over the clients whose mask trained `i`, and a variable nobody trained
gets `trained=False`, which `process.build_masked_finalizer` turns into "keep
its value".

A robust statistic, unweighted: the client weight is accepted (the PVT process
passes one) and ignored, like `tff_partial.privacy.CoordinateMedianFactory`.
Hand-written on `tff.federated_aggregate` (TFF has no median): the server
stacks the clients' updates and masks (memory O(clients x model), fine for
simulation).

Value and weight types as `masked_mean.MaskedMeanFactory`:
  `<update=U, mask=float32[n]>`, `float32`.
Federated type signature of `next`:
  `(<<>@SERVER, {<update=U, mask=float32[n]>}@CLIENTS, {float32}@CLIENTS> ->
    <state=<>@SERVER, result=<update=U, trained=bool[n]>@SERVER,
     measurements=<clients_per_variable=int32[n]>@SERVER>)`
"""

import collections

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.types import type_conversions

from tff_partial.masks import masked_mean
from tff_partial.privacy import median
from tff_partial.privacy import statistics


class MaskedMedianFactory(tff.aggregators.WeightedAggregationFactory):
  """Per-coordinate median over the clients that trained the variable."""

  statistic = statistics.MEDIAN

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    update_type, n = masked_mean._check_value_type(value_type)  # pylint: disable=protected-access
    # The Python container structure the update arrives in (as TFF's
    # DifferentiallyPrivateFactory converts it).
    specs = type_conversions.type_to_tf_tensor_specs(update_type)

    def rows(value):
      return tf.nest.flatten(value['update']) + [value['mask']]

    def report(stacks):
      masks = stacks[-1]
      medians = []
      for i, s in enumerate(stacks[:-1]):
        present = tf.reshape(masks[:, i] > 0, [-1] + [1] * (len(s.shape) - 1))
        medians.append(median.masked_median(s, present))
      return collections.OrderedDict(
          update=tf.nest.pack_sequence_as(specs, medians),
          trained=tf.reduce_sum(masks, axis=0) > 0)

    @tff.tensorflow.computation(value_type)
    def trained_flags(value):
      return tf.cast(value['mask'] > 0, tf.int32)

    def measure(value):
      return tff.federated_zip(collections.OrderedDict(
          clients_per_variable=tff.federated_sum(tff.federated_map(trained_flags, value))))

    return median.build_stacking_process(value_type, rows, report, weight_type, measure)
