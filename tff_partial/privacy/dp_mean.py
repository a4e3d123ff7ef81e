"""A DP mechanism as a sum, and as the fixed-denominator mean of that sum.

DP-FedAvg (McMahan et al. 2018) and DP-FTRL (Kairouz et al. 2021) both clip
each client's update, add Gaussian noise to the *sum* of the clipped updates,
and divide by a fixed, public denominator (clients_per_round). TFF's presets
(`tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed`,
`.tree_aggregation`) wrap tensorflow_privacy's sum query in a
`tfp.NormalizedQuery` and so return only the mean. A method that divides by
other public counts (PVT divides each variable by the number of clients that
trained it, `tff_partial.masks.MaskedMeanFactory`) needs the sum itself. Here
both come from one description of the mechanism:

* `DPSumFactory`: `tff.aggregators.DifferentiallyPrivateFactory(sum_query)`,
  computing `sum_i clip(v_i) + noise` (a SUM);
* `DPMeanFactory`: the same query inside `tfp.NormalizedQuery`, computing
  `(sum_i clip(v_i) + noise) / denominator` (a FIXED-DENOMINATOR MEAN), exactly
  TFF's presets; `DPMeanFactory.sum_factory` is the `DPSumFactory` it divides.

The noise, the clip and so the privacy guarantee (epsilon) are the same for
both: a division by public numbers is post-processing.

Federated type of either process for a value type `V` (unweighted):
  next: `(<S@SERVER, {V}@CLIENTS> -> <state=S@SERVER, result=V@SERVER,
          measurements=<dp_query_metrics, dp>@SERVER>)`.
"""

import abc
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp
# TFF's own DifferentiallyPrivateFactory converts value types to specs with this
# function; the query must see exactly the same structure.
from tensorflow_federated.python.core.impl.types import type_conversions

from tff_partial.privacy import statistics


def record_specs(value_type):
  """The `tf.TensorSpec` structure of `value_type`; floats only."""
  specs = type_conversions.type_to_tf_tensor_specs(value_type)
  for spec in tf.nest.flatten(specs):
    if not spec.dtype.is_floating:
      raise ValueError(
          f'a DP aggregator clips and noises floating-point updates; got {spec.dtype} '
          f'in {value_type}')
  return specs


class DPSumFactory(tff.aggregators.UnweightedAggregationFactory, abc.ABC):
  """Clip each client's value, sum, add noise: a SUM (no division).

  Subclasses give the tensorflow_privacy sum query (`query`); `create` wraps
  it in `tff.aggregators.DifferentiallyPrivateFactory`.
  """

  statistic = statistics.SUM

  def __init__(self, record_aggregation_factory: Optional[
      tff.aggregators.UnweightedAggregationFactory] = None):
    self._record_aggregation_factory = record_aggregation_factory

  @abc.abstractmethod
  def query(self, specs) -> tfp.DPQuery:
    """The sum query for records shaped like `specs`."""

  def create(self, value_type) -> tff.templates.AggregationProcess:
    return tff.aggregators.DifferentiallyPrivateFactory(
        self.query(record_specs(value_type)),
        record_aggregation_factory=self._record_aggregation_factory,
    ).create(value_type)


class DPMeanFactory(tff.aggregators.UnweightedAggregationFactory):
  """`(DP sum) / denominator`: a FIXED-DENOMINATOR MEAN.

  The composition of TFF's presets: `tfp.NormalizedQuery(sum_query,
  denominator)` inside `tff.aggregators.DifferentiallyPrivateFactory`.

  Args:
    sum_factory: the mechanism (clip, noise) as a `DPSumFactory`.
    denominator: the public, fixed denominator (clients per round); > 0.
  """

  statistic = statistics.FIXED_DENOMINATOR_MEAN

  def __init__(self, sum_factory: DPSumFactory, denominator: float):
    if not isinstance(sum_factory, DPSumFactory):
      raise TypeError(f'sum_factory must be a DPSumFactory, got {type(sum_factory).__name__}')
    if not isinstance(denominator, (int, float)) or denominator <= 0:
      raise ValueError(f'denominator={denominator!r} must be a number > 0')
    self._sum_factory = sum_factory
    self._denominator = float(denominator)

  @property
  def sum_factory(self) -> DPSumFactory:
    """The same mechanism without the division (for public per-coordinate counts)."""
    return self._sum_factory

  @property
  def denominator(self) -> float:
    return self._denominator

  def query(self, specs) -> tfp.DPQuery:
    return tfp.NormalizedQuery(self._sum_factory.query(specs), denominator=self._denominator)

  def create(self, value_type) -> tff.templates.AggregationProcess:
    return tff.aggregators.DifferentiallyPrivateFactory(
        self.query(record_specs(value_type)),
        record_aggregation_factory=self._sum_factory._record_aggregation_factory,  # pylint: disable=protected-access
    ).create(value_type)
