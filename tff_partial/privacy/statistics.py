"""What an aggregation factory computes: a sum, a mean, or a robust statistic.

Aggregators that divide by their own counts (`MaskedMeanFactory`,
`DeselectMeanFactory`) wrap inner factories that must compute SUMS, as
`tff.aggregators.MeanFactory` wraps `SumFactory`. A fixed-denominator mean
(DP-FedAvg's and DP-FTRL's presets) or a median put there silently computes
something else (e.g. the mean divided twice). `statistic_of` names what a
factory computes, for the factories of TFF and of this package, so that
wrappers can refuse the wrong kind with a clear message.
"""

from typing import Optional

import tensorflow_federated as tff
import tensorflow_privacy as tfp

SUM = 'sum'
FIXED_DENOMINATOR_MEAN = 'fixed_denominator_mean'
WEIGHTED_MEAN = 'weighted_mean'
MEAN = 'mean'
MEDIAN = 'median'

# TFF factories whose result is the sum of the client values.
_TFF_SUMS = (
    tff.aggregators.SumFactory,
    tff.aggregators.SecureSumFactory,
    tff.aggregators.SecureModularSumFactory,
    tff.aggregators.EncodedSumFactory,
)


def _query_normalizes(query) -> bool:
  """Whether a tensorflow_privacy query divides its sum (NormalizedQuery)."""
  if isinstance(query, tfp.NormalizedQuery):
    return True
  inner = getattr(query, '_numerator', None) or getattr(query, '_inner_query', None)
  return inner is not None and _query_normalizes(inner)


def statistic_of(factory) -> Optional[str]:
  """SUM, FIXED_DENOMINATOR_MEAN, WEIGHTED_MEAN, MEAN, MEDIAN, or None (unknown)."""
  declared = getattr(factory, 'statistic', None)
  if isinstance(declared, str):
    return declared
  if isinstance(factory, _TFF_SUMS):
    return SUM
  if isinstance(factory, tff.aggregators.DifferentiallyPrivateFactory):
    # TFF keeps the query private; its presets normalize (gaussian_fixed,
    # gaussian_adaptive, tree_aggregation), a bare sum query does not.
    query = getattr(factory, '_query', None)
    if query is None:
      return None
    return FIXED_DENOMINATOR_MEAN if _query_normalizes(query) else SUM
  if isinstance(factory, tff.aggregators.MeanFactory):
    return WEIGHTED_MEAN
  if isinstance(factory, tff.aggregators.UnweightedMeanFactory):
    return MEAN
  return None


def check_sum_factory(factory, name: str) -> None:
  """Raises ValueError unless `factory` is an unweighted factory of a SUM.

  Factories this module does not know are taken at their word (documented:
  they must compute a sum).
  """
  if not isinstance(factory, tff.aggregators.UnweightedAggregationFactory):
    raise ValueError(
        f'{name} must be a tff.aggregators.UnweightedAggregationFactory that computes '
        f'a sum, got {type(factory).__name__}')
  statistic = statistic_of(factory)
  if statistic not in (SUM, None):
    raise ValueError(
        f'{name} must compute a sum, but {type(factory).__name__} computes a {statistic} '
        '(the wrapper divides by its own counts; a mean would be divided twice). '
        'Pass the sum variant, e.g. DPMeanFactory.sum_factory.')
