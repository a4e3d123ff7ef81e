"""--algorithm=fedpt: FedPT (Sidahmed et al.), `tff_partial.frozen`.

Flags choose what is frozen (their union): `--frozen_layers` (layer names),
`--frozen_regex` (layer paths matched in full; normalization layers skipped),
`--frozen_target_trainable_fraction` (freeze the largest layers first until
this fraction stays trainable; normalization layers never). The frozen
variables are regenerated on clients from `--seed`.
"""

from absl import flags

from scripts import flag_groups
from tff_partial import frozen
from tff_partial.measure import comm
from tff_partial.training import method

_FROZEN_LAYERS = flags.DEFINE_list(
    'frozen_layers', [],
    'FedPT: comma-separated layer names (paths such as block1/conv1) to freeze; '
    'regenerated on clients from --seed. Normalization layers only when named.')
_FROZEN_REGEX = flags.DEFINE_string(
    'frozen_regex', None,
    'FedPT: freeze every layer whose path fully matches this regex '
    '(normalization layers excluded).')
_FROZEN_TARGET = flags.DEFINE_float(
    'frozen_target_trainable_fraction', None,
    'FedPT: in (0, 1]; freeze the largest non-normalization layers first while '
    'at least this fraction of parameters stays trainable.')

_FROZEN_INITIALIZER = flags.DEFINE_enum(
    'frozen_initializer', 'layer', list(frozen.FROZEN_INITIALIZERS),
    'FedPT: how frozen variables are regenerated from --seed: with their '
    "layer's own Keras initializer (layer), or with a seeded Gaussian "
    '(glorot_normal, he_normal, truncated_normal: Keras defaults) for every '
    'randomly initialized frozen variable, as the paper does; constant ones '
    '(zero biases) are kept. A Gaussian also regenerates an LSTM\'s '
    'Orthogonal recurrent kernel, so lstm1 can be frozen.')

_FROZEN_ORDER = flags.DEFINE_enum(
    'frozen_order', frozen.LARGEST_FIRST, frozen.ORDERS,
    'FedPT: order of --frozen_target_trainable_fraction: largest_first (the '
    'largest non-normalization layers) or input_first (a prefix of the model, '
    'normalization layers included: the backward pass stops at its end).')

FLAG_NAMES = ('frozen_layers', 'frozen_regex', 'frozen_target_trainable_fraction',
              'frozen_initializer', 'frozen_order')


def validate_flags() -> None:
  if not (_FROZEN_LAYERS.value or _FROZEN_REGEX.value
          or _FROZEN_TARGET.value is not None):
    raise flag_groups.FlagError(
        '--algorithm=fedpt needs something to freeze: --frozen_layers=<names> '
        '(e.g. dense1), --frozen_regex=<regex> or '
        '--frozen_target_trainable_fraction=<fraction in (0, 1]>')
  target = _FROZEN_TARGET.value
  if target is not None and not 0.0 < target <= 1.0:
    raise flag_groups.FlagError(
        f'--frozen_target_trainable_fraction={target} must be in (0, 1]')


def frozen_layers_for(keras_model_fn, layers=(), regex=None, target=None,
                      order=frozen.LARGEST_FIRST) -> tuple:
  """Layer paths to freeze in the model of `keras_model_fn`; `FlagError` for bad names."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default():  # a throwaway model, like TFF's baseline tasks
    try:
      return frozen.select_frozen_layers(
          keras_model_fn(), layers=layers, regex=regex,
          target_trainable_fraction=target, order=order)
    except ValueError as e:
      raise flag_groups.FlagError(str(e)) from e


def _frozen_layers_from_flags(keras_model_fn) -> tuple:
  return frozen_layers_for(keras_model_fn, _FROZEN_LAYERS.value, _FROZEN_REGEX.value,
                           _FROZEN_TARGET.value, _FROZEN_ORDER.value)


def check_model(keras_model_fn) -> None:
  """Checks the --frozen_* flags against the task's model before the data loads."""
  _frozen_layers_from_flags(keras_model_fn)


def build(ctx: method.MethodContext) -> method.BuiltMethod:
  return build_from_layers(ctx, _frozen_layers_from_flags(ctx.task.keras_model_fn),
                           frozen_initializer=_FROZEN_INITIALIZER.value)


def build_from_layers(ctx: method.MethodContext, frozen_layers,
                      frozen_initializer: str = 'layer') -> method.BuiltMethod:
  """FedPT with `frozen_layers` (paths) frozen; no flags read."""
  task = ctx.task
  try:
    plan = frozen.plan_freezing(task.keras_model_fn, frozen_layers, frozen_initializer)
    process = frozen.build_fedpt_process(
        task.keras_model_fn, task.loss_fn, task.metrics_fn,
        task.baseline.datasets.element_type_structure,
        frozen_layers=frozen_layers,
        client_optimizer_fn=ctx.client_optimizer,
        server_optimizer_fn=ctx.server_optimizer,
        model_aggregator=ctx.model_aggregator,
        seed=ctx.seed,
        loop_implementation=ctx.loop_implementation,
        frozen_initializer=frozen_initializer,
    )
  except ValueError as e:
    raise flag_groups.FlagError(str(e)) from e
  frozen_paths = {v.path for v in plan.frozen}
  trained_mask = tuple(path not in frozen_paths for path in plan.full_trainable)
  return method.BuiltMethod(
      name='fedpt',
      process=process,
      params_total=plan.params_total,
      params_trainable=plan.params_trainable,
      # The client holds the whole model: it regenerates the frozen part.
      client_model_params=plan.params_total,
      bytes=comm.client_bytes(process.next),
      extra_report={
          'frozen_layers': list(plan.frozen_layers),
          'params_frozen': plan.params_frozen,
          'frozen_initializer': frozen_initializer,
      },
      client_trained_mask_fn=lambda round_num, client_index: trained_mask,
  )
