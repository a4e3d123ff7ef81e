"""--algorithm=pvt: Partial Variable Training (Yang et al.), `tff_partial.masks`.

Flags: --pvt_scheme={fixed,per_round,per_client_per_round,biases_only}
--pvt_freeze_fraction (of the freezable variables, in [0, 1); not with
biases_only, which freezes them all) --pvt_freeze_matrices_first.

Masks reach clients with their data: `client_input_fn(round, index, id,
dataset)` returns `<data=dataset, mask=float32[n]*>` with the mask of
(--seed, round, client index in the round's sample) from
`tff_partial.masks.MaskSampler`.

Bytes (see docs/pvt.md): TFF's types make every client upload a full-size,
zero-filled update plus its mask, since one computation serves all masks. A
real PVT client sends only its trained variables, and receives its mask as a
bitmap of ceil(n/8) bytes. `BuiltMethod.bytes` reports what a real client
sends (up: the trained variables' bytes, expected over the scheme's random
choice, exact for `fixed`; down: the model plus the mask bitmap); the numbers
TFF's types give are kept in `extra_report` (`*_tff_types`).
"""

import importlib
import math

from absl import flags
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from scripts import flag_groups
from tff_partial import masks
from tff_partial import privacy
from tff_partial.masks import schemes
from tff_partial.masks import variable_types
from tff_partial.measure import comm
from tff_partial.privacy import statistics
from tff_partial.training import method

_SCHEME = flags.DEFINE_enum(
    'pvt_scheme', 'per_client_per_round', schemes.SCHEMES,
    'PVT: which variables are frozen: the same for all (fixed), new each round '
    '(per_round), new for each client each round (per_client_per_round), or '
    'every matrix and multiplicative vector, training only the additive '
    'vectors (biases, norm offsets) (biases_only: the paper\'s Table 4).')
_FREEZE_FRACTION = flags.DEFINE_float(
    'pvt_freeze_fraction', 0.9,
    'PVT: fraction of the freezable variables (multiplicative vectors and '
    'matrices) each client freezes, in [0, 1); additive vectors always train.')
_MATRICES_FIRST = flags.DEFINE_bool(
    'pvt_freeze_matrices_first', False,
    'PVT: freeze multiplicative matrices before multiplicative vectors.')

FLAG_NAMES = ('pvt_scheme', 'pvt_freeze_fraction', 'pvt_freeze_matrices_first')


def validate_flags() -> None:
  fraction = _FREEZE_FRACTION.value
  if _SCHEME.value == 'biases_only':
    for flag in (flags.FLAGS['pvt_freeze_fraction'], flags.FLAGS['pvt_freeze_matrices_first']):
      if flag.present or not flag.using_default_value:
        raise flag_groups.FlagError(
            f'--{flag.name} does not apply to --pvt_scheme=biases_only, which '
            'freezes every freezable variable (matrices and multiplicative vectors)')
    return
  if fraction is None or not 0.0 <= fraction < 1.0:
    raise flag_groups.FlagError(
        f'--pvt_freeze_fraction={fraction} must be in [0, 1): the fraction of '
        'freezable variables frozen per client (to freeze them all and train '
        'only biases and norm offsets: --pvt_scheme=biases_only)')


def build(ctx: method.MethodContext) -> method.BuiltMethod:
  return build_pvt_method(
      ctx, scheme=_SCHEME.value, freeze_fraction=_FREEZE_FRACTION.value,
      freeze_matrices_first=_MATRICES_FIRST.value)


def register_task_layers() -> None:
  """Roles of the task models' custom layers (see variable_types)."""
  try:
    stackoverflow = importlib.import_module('tasks.stackoverflow')
  except ModuleNotFoundError as e:
    if e.name != 'tasks.stackoverflow':
      raise
    return
  position = getattr(stackoverflow, 'PositionEmbedding', None)
  if position is not None:
    # Learned position embeddings are added to the token embeddings: an
    # additive table (non-freezable by default).
    variable_types.register_layer_roles(
        position, {'embeddings': variable_types.ADDITIVE_VECTOR})
  tied = getattr(stackoverflow, 'TiedEmbedding', None)
  if tied is not None:
    # The tied output's bias adds to the logits: an additive vector.
    variable_types.register_layer_roles(
        tied, {'embeddings': variable_types.MULTIPLICATIVE_MATRIX,
               'output_bias': variable_types.ADDITIVE_VECTOR})


def _aggregator(model_aggregator):
  """(PVT aggregation factory, client weighting) for `ctx.model_aggregator`.

  * None (`--aggregator=mean`): `MaskedMeanFactory`, example-weighted: each
    variable's weighted mean over the clients that trained it (PVT, Fig. 1).
  * A DP fixed-denominator mean (`privacy.DPMeanFactory`: dp_gaussian,
    dp_ftrl): its `sum_factory` inside `MaskedMeanFactory`, clients weighted
    uniformly. So each client's whole masked update (zeros where it froze) is
    clipped, the noise is added to the SUM of every coordinate (the mechanism
    and so the epsilon of the flags, unchanged), and each variable is then
    divided by the number of clients that trained it. That division is
    post-processing: the counts are public because masks come from
    (seed, round, client slot), not from data. Dividing the DP *mean* again
    would shrink every step by clients_per_round (what this did before).
    With dp_ftrl and random masks the per-round counts break the exact
    telescoping of the tree noise (see `privacy/dp_ftrl.py`).
  * A median (`--aggregator=median`): `MaskedMedianFactory`, per coordinate
    the median over the clients that trained the variable (the zeros of
    clients that froze it are not votes); a variable nobody trained keeps its
    value.
  * Any other unweighted factory must compute a SUM (e.g. a secure sum); the
    masked mean refuses those known not to.
  """
  if model_aggregator is None:
    return masks.MaskedMeanFactory(), tff.learning.ClientWeighting.NUM_EXAMPLES
  uniform = tff.learning.ClientWeighting.UNIFORM
  if isinstance(model_aggregator, privacy.DPMeanFactory):
    return masks.MaskedMeanFactory(value_sum_factory=model_aggregator.sum_factory), uniform
  if privacy.statistic_of(model_aggregator) == statistics.MEDIAN:
    return masks.MaskedMedianFactory(), uniform
  if isinstance(model_aggregator, tff.aggregators.UnweightedAggregationFactory):
    try:
      return masks.MaskedMeanFactory(value_sum_factory=model_aggregator), uniform
    except ValueError as e:
      raise flag_groups.FlagError(f'--algorithm=pvt: {e}') from e
  raise flag_groups.FlagError(
      f'--algorithm=pvt cannot use the weighted aggregator '
      f'{type(model_aggregator).__name__}: PVT averages each variable over the '
      'clients that trained it, so it needs an unweighted sum factory to wrap '
      'in its masked mean (or --aggregator=mean)')


def build_pvt_method(
    ctx: method.MethodContext,
    *,
    scheme: str = 'per_client_per_round',
    freeze_fraction: float = 0.9,
    freeze_matrices_first: bool = False,
) -> method.BuiltMethod:
  """`BuiltMethod` of PVT on `ctx.task` (the flags' values passed in)."""
  register_task_layers()
  keras_model = ctx.task.keras_model_fn()
  try:
    types = variable_types.classify_variables(keras_model)
  except ValueError as e:
    raise flag_groups.FlagError(f'--algorithm=pvt --task={ctx.task.name}: {e}') from e
  weights_type = method.model_weights_type(ctx.task)
  trainable_types = list(weights_type.trainable)
  if len(trainable_types) != len(types) or any(
      tuple(t.shape) != tuple(v.shape)
      for t, v in zip(trainable_types, keras_model.trainable_weights)):
    raise ValueError(
        f'task {ctx.task.name}: the Keras model\'s trainable weights do not match '
        'the TFF model weights in order and shape')
  try:
    sampler = schemes.MaskSampler(
        types, scheme, freeze_fraction, seed=ctx.seed,
        freeze_matrices_first=freeze_matrices_first)
  except ValueError as e:
    raise flag_groups.FlagError(str(e)) from e
  aggregator, weighting = _aggregator(ctx.model_aggregator)
  process = masks.build_pvt_process(
      ctx.task.baseline.model_fn,
      client_optimizer_fn=ctx.client_optimizer,
      server_optimizer_fn=ctx.server_optimizer,
      model_aggregator=aggregator,
      client_weighting=weighting,
      loop_implementation=ctx.loop_implementation,
      # A fixed mask is known now: clients differentiate only what they train.
      static_mask=(tuple(bool(m) for m in sampler.mask(0, 0))
                   if sampler.is_static else None))

  def client_input_fn(round_num, client_index, client_id, dataset):
    del client_id  # masks are keyed by the client's slot in the round's sample
    return masks.client_input(dataset, sampler.mask(round_num, client_index))

  variable_bytes = [comm.tensor_bytes(t) for t in trainable_types]
  variable_params = [int(np.prod(t.shape, dtype=np.int64)) for t in trainable_types]
  tff_bytes = comm.client_bytes(process.next)
  mask_bitmap_bytes = math.ceil(sampler.num_variables / 8)
  real_bytes = comm.ClientBytes(
      down_payload=tff_bytes.down_payload + mask_bitmap_bytes,
      down_overhead=tff_bytes.down_overhead,
      up_payload=int(round(schemes.trained_bytes(sampler, variable_bytes))),
      up_overhead=tff_bytes.up_overhead,
  )
  expected_trained_params = schemes.trained_bytes(sampler, variable_params)
  params_total = method.count_params(weights_type)
  counts = {t.value: sum(1 for x in types if x == t) for t in variable_types.VariableType}
  how = (f'exact ({scheme} mask)' if sampler.is_static
         else 'expected over the random masks')
  return method.BuiltMethod(
      name='pvt',
      process=process,
      params_total=params_total,
      params_trainable=int(round(expected_trained_params)),
      client_model_params=params_total,
      bytes=real_bytes,
      bytes_note=(
          'bytes_up_per_client: the trained variables a real PVT client sends '
          f'({how}); bytes_down_per_client: the model plus the mask bitmap '
          f'({mask_bitmap_bytes} B). The TFF simulation uploads a full-size, '
          'zero-filled update and the mask (one computation serves every mask): '
          'see bytes_*_per_client_tff_types.'),
      client_input_fn=client_input_fn,
      extra_report={
          'pvt_scheme': scheme,
          'pvt_freeze_fraction': (
              1.0 if scheme == 'biases_only' else freeze_fraction),
          'pvt_freeze_matrices_first': freeze_matrices_first,
          'pvt_num_variables': sampler.num_variables,
          'pvt_num_freezable': len(sampler.freezable),
          'pvt_num_frozen_per_client': sampler.num_frozen,
          'pvt_variable_type_counts': counts,
          'bytes_down_per_client_tff_types': tff_bytes.down_payload,
          'bytes_up_per_client_tff_types': tff_bytes.up_payload,
          'pvt_upload_reduction_vs_fedavg': (
              comm.fedavg_bytes(weights_type).up_payload / real_bytes.up_payload),
      },
      client_trained_mask_fn=lambda round_num, client_index: tuple(
          bool(m) for m in sampler.mask(round_num, client_index)),
  )
