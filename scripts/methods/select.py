"""--algorithm=select: federated select (Charles et al. 2022, Algorithm 2).

Flags:
  --select_layer: comma-separated layer names (e.g. `conv2`, `dense1`,
    `embedding,output`, `embedding,output,encoder0_ffn1`);
  --select_keys: m, keys per client (of the first layer's key space);
  --select_policy: top | random_top | random | random_local | mixed (see
    `tff_partial/select/keys.py`);
  --select_same_keys_per_round: random keys shared by all clients of a round
    (the paper's Fig. 6 "same keys per round");
  --select_fixed_client_keys: each client draws its random keys once and keeps
    them every round (as `top` keys are);
  --select_bucket_size: B, indices per key of the structured key space (a key
    selects B consecutive rows; keeps TFF's per-key select calls few);
  --select_rescale: random keys: clients scale the kept units' activations by
    K/m (inverted dropout) so the full server model matches its clients
    (off by default: the paper does not rescale, and on FEMNIST it calibrated
    the loss but did not raise accuracy; see docs/select.md).

How `--aggregator` composes with select (docs/select.md, docs/privacy.md):
  mean: the sparse per-key weighted mean (`DeselectMeanFactory(spec)`): each
    key's slices averaged over the clients that chose the key, weighted by
    examples; the broadcast variables over all clients.
  median: the per-key median over the clients that chose the key
    (`DeselectMedianFactory`); broadcast variables: over all clients.
  dp_gaussian, dp_ftrl: the paper's eq. (5), `(1/N) sum_n phi(u_n, z_n)` over
    all N = clients_per_round clients (`DeselectMeanFactory.paper_mean`): each
    client's update is scattered to the dense model shape, clipped and noised
    as a whole, and divided by the fixed N. No per-key counts are released
    (they would reveal keys). A key chosen by c of N clients therefore moves
    c/N as far as under `mean`: with random keys about m/K (the client model
    fraction) at the same server learning rate; scale the server learning
    rate (or accept the smaller steps) when comparing with `mean`.
Output layers sliced by class (structured keys, e.g. emnist_cnn `dense2`)
without an OOV class: a client's examples of classes it did not select are
dropped (`slicing.remap_batch`).
"""

from absl import flags

from scripts import flag_groups
from tff_partial import privacy
from tff_partial import select as select_lib
from tff_partial.select import keys as keys_lib
from tff_partial.select import process as process_lib
from tff_partial.select import slicing
from tff_partial.measure import comm
from tff_partial.privacy import statistics
from tff_partial.training import method

_LAYER = flags.DEFINE_list(
    'select_layer', None,
    'Layers to apply federated select to (comma-separated names), e.g. conv2, '
    'dense1, embedding,output.')
_KEYS = flags.DEFINE_integer(
    'select_keys', None,
    'm: select keys per client (in the first layer key space). With '
    '--aggregator=dp_gaussian/dp_ftrl a key\'s update is divided by all '
    'clients_per_round clients (the paper\'s eq. 5), not by those that chose it '
    'as with mean: steps about m/K as large at the same server learning rate.')
_POLICY = flags.DEFINE_enum(
    'select_policy', 'random', keys_lib.POLICIES,
    'How clients choose keys: top (m most frequent features in their data), '
    'random_top (m of the 2m most frequent), random (uniform over all keys), '
    'random_local (uniform over the keys in the client\'s data: the paper\'s '
    'Fig. 4 "Random"), mixed (top on input/output layers, random on inner layers).')
_SAME_KEYS = flags.DEFINE_bool(
    'select_same_keys_per_round', False,
    'Random keys: one key set per round shared by all its clients (Fig. 6).')
_FIXED_CLIENT_KEYS = flags.DEFINE_bool(
    'select_fixed_client_keys', False,
    'Random keys (random, random_top, random_local, mixed): each client draws '
    'its keys once and keeps them in every round, as top keys are.')
_BUCKET = flags.DEFINE_integer(
    'select_bucket_size', 1,
    'Indices per key of the structured key space (must divide its size).')

_IMPLEMENTATION = flags.DEFINE_enum(
    'select_implementation', process_lib.AUTO, process_lib.IMPLEMENTATIONS,
    'How slices reach clients in simulation: federated_select (TFF\'s '
    'intrinsic, one select call per key), broadcast_gather (the same values: '
    'the server value broadcast, each client gathers its keys; close to a '
    'broadcast of the payload in time) or auto (broadcast_gather). Bytes are '
    'those of a deployed select either way.')

_RESCALE = flags.DEFINE_bool(
    'select_rescale', False,
    'Random keys (conv filters, hidden units): the client sub-model multiplies '
    'the m kept units\' activations by K/m, as inverted dropout does, so the '
    'server model evaluated with all K units sees inputs of the size its '
    'clients trained with. Default false: Algorithm 2 exactly as the paper '
    'writes it (no scaling; the full model then over-drives the next layer).')

FLAG_NAMES = ('select_layer', 'select_keys', 'select_policy',
              'select_same_keys_per_round', 'select_fixed_client_keys',
              'select_bucket_size', 'select_rescale', 'select_implementation')


def validate_flags() -> None:
  """Checks that need no model; `build` checks layers and key counts."""
  if not _LAYER.value:
    raise flag_groups.FlagError(
        '--algorithm=select needs --select_layer (e.g. conv2 for emnist_cnn, '
        'dense1 for emnist_2nn)')
  if _KEYS.value is None or _KEYS.value < 1:
    raise flag_groups.FlagError(
        f'--select_keys={_KEYS.value} must be a positive integer')
  if _BUCKET.value < 1:
    raise flag_groups.FlagError(
        f'--select_bucket_size={_BUCKET.value} must be a positive integer')
  if _SAME_KEYS.value and _POLICY.value not in ('random', 'mixed'):
    raise flag_groups.FlagError(
        '--select_same_keys_per_round applies to --select_policy=random or '
        f'mixed, not {_POLICY.value}')
  if _FIXED_CLIENT_KEYS.value and _POLICY.value == 'top':
    raise flag_groups.FlagError(
        '--select_fixed_client_keys applies to random key choices (random, '
        'random_top, random_local, mixed); top keys are the same every round')
  if _FIXED_CLIENT_KEYS.value and _SAME_KEYS.value:
    raise flag_groups.FlagError(
        '--select_fixed_client_keys (one draw per client for all rounds) and '
        '--select_same_keys_per_round (one draw per round for all clients) '
        'exclude each other')


def select_spec(task, layers, keys_per_client, policy, bucket_size=1,
                rescale=False):
  """The `SelectSpec` of the task's model; bad flags -> FlagError.

  Token tasks (`task.oov_token` set): words a client did not select become
  its out-of-vocabulary token, like words outside a smaller vocabulary.
  """
  return _spec_of_model(task.keras_model_fn(), layers, keys_per_client, policy,
                        bucket_size, rescale, oov_index=task.oov_token)


def _spec_of_model(model, layers, keys_per_client, policy, bucket_size, rescale,
                   oov_index=None):
  try:
    configs = slicing.group_configs(model, layers, keys_per_client, policy,
                                    bucket_size, oov_index=oov_index, rescale=rescale)
    return slicing.make_select_spec(model, configs)
  except ValueError as e:
    raise flag_groups.FlagError(str(e)) from e


def check_model(keras_model_fn) -> None:
  """Checks --select_layer/keys/policy/bucket/rescale against the task's model
  before the data loads. Without the task's out-of-vocabulary token, which
  changes only where a group keeps padding, not whether the flags are valid.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default():  # a throwaway model
    _spec_of_model(keras_model_fn(), _LAYER.value, _KEYS.value, _POLICY.value,
                   _BUCKET.value, _RESCALE.value)


def build_from_args(ctx: method.MethodContext, layers, keys_per_client: int,
                    policy: str, same_keys_per_round: bool = False,
                    bucket_size: int = 1, rescale: bool = False,
                    fixed_client_keys: bool = False,
                    implementation: str = process_lib.AUTO) -> method.BuiltMethod:
  """`build` without flags (tests and benchmarks call this)."""
  task = ctx.task
  spec = select_spec(task, layers, keys_per_client, policy, bucket_size, rescale)
  deselect = None  # mean: the sparse per-key weighted mean
  aggregator = ctx.model_aggregator
  if aggregator is not None:
    if privacy.statistic_of(aggregator) == statistics.MEDIAN:
      deselect = select_lib.DeselectMedianFactory(spec)
    else:
      try:  # DP: eq. (5), the fixed-denominator mean over all N clients
        deselect = select_lib.DeselectMeanFactory.paper_mean(spec, aggregator)
      except ValueError as e:
        raise flag_groups.FlagError(f'--algorithm=select: {e}') from e
  input_spec = task.baseline.datasets.element_type_structure
  process, traffic_next = process_lib.build_federated_select_process_and_traffic(
      task.keras_model_fn, task.loss_fn, task.metrics_fn, input_spec, spec,
      ctx.client_optimizer, ctx.server_optimizer, deselect_factory=deselect,
      loop_implementation=ctx.loop_implementation, implementation=implementation)
  try:
    policy_obj = keys_lib.KeyPolicy(spec, policy, seed=ctx.seed,
                                    same_keys_per_round=same_keys_per_round,
                                    fixed_client_keys=fixed_client_keys)
  except ValueError as e:
    raise flag_groups.FlagError(str(e)) from e

  def client_input_fn(round_num, client_index, client_id, dataset):
    del client_index
    return process_lib.client_input(
        dataset, policy_obj.client_keys(round_num, client_id, dataset))

  weights_type = method.model_weights_type(task)
  params_total = method.count_params(weights_type)
  held = slicing.client_params(spec) + method.count_params(weights_type.non_trainable)
  return method.BuiltMethod(
      name='select',
      process=process,
      params_total=params_total,
      params_trainable=slicing.client_params(spec),
      client_model_params=held,
      # What a deployed select sends (the federated_select form), whichever
      # implementation the simulation runs.
      bytes=comm.client_bytes(traffic_next),
      bytes_note=('up bytes count the int32 keys twice: once sent to '
                  'federated_select, once with the update for deselection'),
      client_input_fn=client_input_fn,
      extra_report={
          'select_same_keys_per_round': same_keys_per_round,
          'select_fixed_client_keys': fixed_client_keys,
          'select_groups': {
              g.name: {'layers': list(g.layers), 'kind': g.kind,
                       'keys_per_client': g.keys_per_client,
                       'num_keys': g.num_keys, 'bucket_size': g.bucket_size,
                       'output_scale': g.output_scale,
                       'policy': policy_obj._group_policy(g)}  # pylint: disable=protected-access
              for g in spec.groups},
          'select_implementation': process_lib.resolve_implementation(implementation, spec),
      },
      # A client trains its sliced sub-model, not the task's Keras model.
      client_model_is_task_model=False,
  )


def build(ctx: method.MethodContext) -> method.BuiltMethod:
  validate_flags()
  return build_from_args(ctx, _LAYER.value, _KEYS.value, _POLICY.value,
                         _SAME_KEYS.value, _BUCKET.value, _RESCALE.value,
                         _FIXED_CLIENT_KEYS.value, _IMPLEMENTATION.value)
