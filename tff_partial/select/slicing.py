"""Select keys -> slices of a Keras model, and back (federated select, sec. 4.1).

Charles et al., *Federated Select* (2022), Algorithm 2: a client with select
keys `z = [z_1..z_m]` receives `[psi(x, z_1), ..., psi(x, z_m)]` and sends back
an update that the server *deselects* (`phi`) into the full model. This module
defines `psi` and `phi` for the layer kinds of the paper, generically by layer
name and Keras layer class:

* structured keys (sec. 4.1.1, 5.2, 5.4; a Dense layer that both reads the
  input and is the output, like logistic regression, is sliced by input rows):
  - `Embedding`: key k selects row k of the embedding table (`rows`);
  - a `Dense` layer fed by the model input (bag of words): row k of its kernel
    (`rows`); the client's inputs are restricted to the selected features;
  - the output `Dense` layer (softmax / one-vs-rest): output unit k, i.e. its
    kernel column k and bias k (`outputs`); the client's softmax is restricted
    to its selected outputs. Several layers may share one key space (the
    vocabulary of a word model selects embedding rows *and* output units).
* random keys (sec. 4.1.2, 5.3):
  - `Conv2D`: filter k = kernel[..., k], bias[k], the per-channel parameters
    of a following normalization layer (gamma[k], beta[k]) and the matching
    input channel of the next conv (kernel[:, :, k, :]) or, after a `Flatten`,
    the rows {h*W*C + w*C + k} of the next dense kernel;
  - hidden `Dense`: unit k = kernel[:, k], bias[k] and row k of the next
    dense kernel.

Keys may be *buckets* (`bucket_size` B > 1): key b selects the B consecutive
indices b*B .. b*B+B-1, so a client with m keys holds m*B rows/units. TFF's
`federated_select` calls the select function once per key; buckets keep the
number of calls low for large vocabularies (see `bench.py`).

Every sliced variable is seen through a *view*: a reshape of the variable
that makes the key axis explicit (a dense kernel after `Flatten` of an
(H, W, C) tensor is viewed as [H*W, C, units]). Slices of one key are the view
gathered at that key's B indices; the client's sub-model variable is the view
with the key axis shrunk to m*B (keys in the client's key order), reshaped
back. The client model is the task's Keras model cloned with the selected
layers narrowed (`build_client_keras_model`), so the client really holds only
its sub-model. All slicing here is written by hand: neither TFF nor Keras
has model slicing by keys.
"""

import collections
import dataclasses
import math
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

ROWS = 'rows'          # structured: embedding rows or first-dense kernel rows
OUTPUTS = 'outputs'    # structured: output units of the final layer
UNITS = 'units'        # random: conv filters or hidden dense units

_NORM_LAYERS = (
    tf.keras.layers.GroupNormalization,
    tf.keras.layers.BatchNormalization,
    tf.keras.layers.LayerNormalization,
)
_PASS_THROUGH = (
    tf.keras.layers.MaxPool2D, tf.keras.layers.AveragePooling2D,
    tf.keras.layers.Dropout, tf.keras.layers.Activation, tf.keras.layers.ReLU,
    tf.keras.layers.SpatialDropout2D,
)


@dataclasses.dataclass(frozen=True)
class VariableSlice:
  """How keys index one trainable variable.

  Attributes:
    index: position in `model.trainable_weights`.
    name: the variable's name (for messages).
    shape: full shape of the variable.
    view_shape: the variable reshaped so that the key axis is explicit.
    axis: the key axis of `view_shape`.
  """

  index: int
  name: str
  shape: tuple
  view_shape: tuple
  axis: int

  def sub_view_shape(self, num_indices: int) -> tuple:
    s = list(self.view_shape)
    s[self.axis] = num_indices
    return tuple(s)

  def sub_shape(self, num_indices: int) -> tuple:
    """Shape of the client's variable holding `num_indices` of the K indices."""
    view = self.sub_view_shape(num_indices)
    if len(self.view_shape) == len(self.shape):
      return view
    # A flattened-dense kernel viewed as [H*W, C, U] is stored as [H*W*C', U].
    return (int(np.prod(view[:-1])), view[-1])

  def slice_shape(self, bucket_size: int) -> tuple:
    """Shape of what one key selects (the view without the key axis, B there)."""
    return self.sub_view_shape(bucket_size)


@dataclasses.dataclass(frozen=True)
class SelectGroup:
  """One key space and the variable slices its keys select.

  Attributes:
    name: group name (the first layer's name), e.g. `conv2` or `embedding`.
    kind: `rows`, `outputs`, `units`, or `rows+outputs` (a vocabulary selecting
      embedding rows and output units together).
    layers: the selected layers (not the coupled neighbours).
    num_indices: K, the size of the indexed axis (filters, units, vocabulary).
    bucket_size: B; the key space is [0, ceil(K / B)).
    keys_per_client: m, keys each client sends (so it holds m*B indices).
    structured: whether keys come from the client's data (else random).
    slices: the variables this group's keys index.
    input_role: `tokens` (embedding inputs), `features` (bag-of-words inputs)
      or None: how the client's inputs are remapped to its sub-model.
    output_role: `classes` or None: labels are remapped to the selected
      outputs (class ids to local ids; one/multi-hot labels gathered).
    oov_index: for `tokens`/`classes`: the index a client maps tokens it did not
      select to (its key is always selected); None maps them to local index 0,
      except class labels of one class per example: those examples are
      dropped (`remap_batch`; local 0 is a real class).
    output_scale: random keys only: the client's sub-model multiplies the
      selected layer's activations by this factor (K / (m*B) with
      `rescale=True`, as inverted dropout does), so that the server model,
      which sums over all K units, sees inputs of the size its clients trained
      with. 1.0 is Algorithm 2 as written.
    pad_index: 0 when token 0 is padding that every client keeps as its local
      0: the group's embedding has `mask_zero` (Keras masks local id 0), or
      the group is a token vocabulary (`oov_index` set, TFF's token layout)
      whose padding labels the word tasks' loss skips as class 0; else None.
  """

  name: str
  kind: str
  layers: tuple
  num_indices: int
  bucket_size: int
  keys_per_client: int
  structured: bool
  slices: tuple
  input_role: Optional[str] = None
  output_role: Optional[str] = None
  oov_index: Optional[int] = None
  output_scale: float = 1.0
  pad_index: Optional[int] = None

  @property
  def num_keys(self) -> int:
    return -(-self.num_indices // self.bucket_size)

  @property
  def client_indices(self) -> int:
    return self.keys_per_client * self.bucket_size


@dataclasses.dataclass(frozen=True)
class SelectSpec:
  """The select groups of a model, and the variables broadcast in full."""

  groups: tuple
  num_trainable: int
  trainable_shapes: tuple
  broadcast_indices: tuple

  def group(self, name: str) -> SelectGroup:
    for g in self.groups:
      if g.name == name:
        return g
    raise KeyError(name)


@dataclasses.dataclass(frozen=True)
class GroupConfig:
  """What to select: layers sharing one key space, and how many keys."""

  layers: Sequence[str]
  keys_per_client: int
  structured: bool
  bucket_size: int = 1
  oov_index: Optional[int] = None
  output_scale: float = 1.0


def selectable_layers(model: tf.keras.Model) -> list:
  """Names of the layers whose kind this module can slice."""
  names = []
  for layer in model.layers:
    if isinstance(layer, (tf.keras.layers.Embedding, tf.keras.layers.Dense,
                          tf.keras.layers.Conv2D)):
      names.append(layer.name)
  return names


def _var_index(model, var) -> int:
  for i, v in enumerate(model.trainable_weights):
    if v is var:
      return i
  raise ValueError(f'{var.name} is not a trainable variable of the model')


def _vslice(model, var, axis, view_shape=None) -> VariableSlice:
  shape = tuple(int(d) for d in var.shape)
  view = tuple(view_shape) if view_shape is not None else shape
  axis = axis % len(view)
  return VariableSlice(_var_index(model, var), var.name, shape, view, axis)


def _consumers(layer):
  out = []
  for node in getattr(layer, '_outbound_nodes', []):
    out.append(node.outbound_layer)
  return out


def _is_model_input_layer(model, layer) -> bool:
  """Whether `layer` reads the model's input directly (no layer in between)."""
  for node in layer._inbound_nodes:  # pylint: disable=protected-access
    for inbound in tf.nest.flatten(node.inbound_layers):
      if not isinstance(inbound, tf.keras.layers.InputLayer):
        return False
  return True


def _is_output_layer(model, layer) -> bool:
  return any(layer is l for l in model._output_layers)  # pylint: disable=protected-access


def _norm_in_chain(layer) -> bool:
  """Whether a normalization layer follows `layer` before its consumer."""
  current = layer
  while True:
    nxt = _consumers(current)
    if len(nxt) != 1:
      return False
    current = nxt[0]
    if isinstance(current, _NORM_LAYERS):
      return True
    if not isinstance(current, (tf.keras.layers.Flatten,) + _PASS_THROUGH):
      return False


def _unit_slices(model, layer) -> list:
  """A random-key unit/filter of `layer` and its coupled neighbours."""
  slices = [_vslice(model, layer.kernel, -1)]
  if layer.use_bias:
    slices.append(_vslice(model, layer.bias, 0))
  channels = int(layer.kernel.shape[-1])
  current = layer
  flatten_from = None
  while True:
    nxt = _consumers(current)
    if len(nxt) != 1:
      raise ValueError(
          f'--select_layer={layer.name}: its output feeds {len(nxt)} layers; '
          'random unit selection needs one consumer chain ending in a Dense '
          'or Conv2D layer')
    current = nxt[0]
    if isinstance(current, _NORM_LAYERS):
      for w in current.trainable_weights:
        if tuple(w.shape) != (channels,):
          raise ValueError(f'{current.name}: cannot slice {w.name} by channel')
        slices.append(_vslice(model, w, 0))
      continue
    if isinstance(current, tf.keras.layers.Flatten):
      flatten_from = tuple(int(d) for d in current.input_shape[1:])
      continue
    if isinstance(current, _PASS_THROUGH):
      continue
    if isinstance(current, tf.keras.layers.Conv2D):
      slices.append(_vslice(model, current.kernel, 2))
      return slices
    if isinstance(current, tf.keras.layers.Dense):
      kernel = current.kernel
      if flatten_from is not None:
        if flatten_from[-1] != channels:
          raise ValueError(f'{current.name}: flatten input {flatten_from} does '
                           f'not end in {channels} channels')
        view = (int(np.prod(flatten_from[:-1])), channels, int(kernel.shape[-1]))
        slices.append(_vslice(model, kernel, 1, view))
      else:
        slices.append(_vslice(model, kernel, 0))
      return slices
    raise ValueError(
        f'--select_layer={layer.name}: cannot couple its units through layer '
        f'{current.name} ({type(current).__name__})')


def make_select_spec(model: tf.keras.Model,
                     groups: Sequence[GroupConfig]) -> SelectSpec:
  """Builds the `SelectSpec` of `model` (a built Keras model) for `groups`."""
  known = selectable_layers(model)
  out = []
  used = {}
  for cfg in groups:
    if not cfg.layers:
      raise ValueError('--select_layer: a group names no layer')
    slices = []
    kinds = []
    num = None
    input_role = output_role = None
    pad_index = None
    for name in cfg.layers:
      if name not in known:
        raise ValueError(
            f'--select_layer={name!r} is not a selectable layer of '
            f'{model.name}; valid values: {", ".join(known)}')
      layer = model.get_layer(name)
      if cfg.structured:
        if isinstance(layer, tf.keras.layers.Embedding):
          kinds.append(ROWS)
          n = int(layer.embeddings.shape[0])
          slices.append(_vslice(model, layer.embeddings, 0))
          input_role = 'tokens'
          if layer.mask_zero:
            pad_index = 0
          if _is_output_layer(model, layer):
            # A tied embedding (input lookup and output logits share the
            # matrix): its rows are sliced once for both, plus its output bias.
            kinds.append(OUTPUTS)
            slices.extend(_vslice(model, w, 0) for w in layer.trainable_weights
                          if w is not layer.embeddings)
            output_role = 'classes'
        elif (isinstance(layer, tf.keras.layers.Dense)
              and _is_model_input_layer(model, layer)):
          kinds.append(ROWS)
          n = int(layer.kernel.shape[0])
          slices.append(_vslice(model, layer.kernel, 0))
          input_role = 'features'
        elif (isinstance(layer, tf.keras.layers.Dense)
              and _is_output_layer(model, layer)):
          kinds.append(OUTPUTS)
          n = int(layer.kernel.shape[-1])
          slices.append(_vslice(model, layer.kernel, -1))
          if layer.use_bias:
            slices.append(_vslice(model, layer.bias, 0))
          output_role = 'classes'
        else:
          raise ValueError(
              f'--select_layer={name}: structured keys apply to an Embedding, '
              'a Dense layer reading the model input, or the output Dense '
              'layer; use random keys for inner layers')
      else:
        if not isinstance(layer, (tf.keras.layers.Dense, tf.keras.layers.Conv2D)):
          raise ValueError(
              f'--select_layer={name}: random keys apply to Conv2D filters or '
              f'Dense units, not {type(layer).__name__}')
        if _is_output_layer(model, layer):
          raise ValueError(
              f'--select_layer={name} is the output layer: select its units '
              'with structured keys (top, random_top)')
        kinds.append(UNITS)
        n = int(layer.kernel.shape[-1])
        slices.extend(_unit_slices(model, layer))
      if num is not None and n != num:
        raise ValueError(
            f'--select_layer={",".join(cfg.layers)}: layers of one key space '
            f'must have the same size; got {num} and {n}')
      num = n
    for s in slices:
      if s.index in used:
        raise ValueError(
            f'variable {s.name} would be selected by both {used[s.index]} and '
            f'{cfg.layers[0]}; one variable can be sliced by one key space')
      used[s.index] = cfg.layers[0]
    if cfg.oov_index is not None and (input_role or output_role):
      # A token vocabulary (TFF's layout: 0 is padding). The loss of the word
      # tasks skips label 0 (`tasks.data_utils.padding_ignoring_loss`), so
      # padding must stay local 0 even without a mask_zero embedding in the
      # group (e.g. `stackoverflow_nwp`, or `output` selected alone).
      pad_index = 0
    if cfg.bucket_size < 1:
      raise ValueError(f'bucket_size must be >= 1, got {cfg.bucket_size}')
    if cfg.output_scale != 1.0:
      if cfg.structured:
        raise ValueError(f'{cfg.layers[0]}: output_scale applies to random '
                         '(unit/filter) keys only')
      for name in cfg.layers:
        if _norm_in_chain(model.get_layer(name)):
          raise ValueError(
              f'--select_rescale: a normalization layer follows {name}, which '
              'undoes an activation scale; use --select_rescale=false')
    if num % cfg.bucket_size:
      raise ValueError(
          f'bucket_size={cfg.bucket_size} must divide the {num} indices of '
          f'{cfg.layers[0]}')
    num_keys = num // cfg.bucket_size
    if not 1 <= cfg.keys_per_client <= num_keys:
      raise ValueError(
          f'--select_keys={cfg.keys_per_client} for {",".join(cfg.layers)}: '
          f'must be between 1 and the maximum {num_keys}')
    out.append(SelectGroup(
        name=cfg.layers[0],
        kind='+'.join(sorted(set(kinds))),
        layers=tuple(cfg.layers),
        num_indices=num,
        bucket_size=cfg.bucket_size,
        keys_per_client=cfg.keys_per_client,
        structured=cfg.structured,
        slices=tuple(slices),
        input_role=input_role,
        output_role=output_role,
        oov_index=cfg.oov_index,
        output_scale=float(cfg.output_scale),
        pad_index=pad_index,
    ))
  shapes = tuple(tuple(int(d) for d in v.shape) for v in model.trainable_weights)
  broadcast = tuple(i for i in range(len(shapes)) if i not in used)
  return SelectSpec(groups=tuple(out), num_trainable=len(shapes),
                    trainable_shapes=shapes, broadcast_indices=broadcast)


# ---------------------------------------------------------------------------
# psi: the select function (one key -> its slices), and the server value.
def server_views(spec: SelectSpec, group: SelectGroup, trainable):
  """The group's variables as [num_keys, *slice_shape] tensors (key-major).

  This is the server value `federated_select` reads from: key b is row b.
  """
  out = []
  for s in group.slices:
    v = tf.reshape(trainable[s.index], s.view_shape)
    # [..., K, ...] -> [..., num_keys, B, ...] -> [num_keys, ..., B, ...]
    shape = list(s.view_shape)
    split = shape[:s.axis] + [group.num_keys, group.bucket_size] + shape[s.axis + 1:]
    v = tf.reshape(v, split)
    perm = [s.axis] + [i for i in range(len(split)) if i != s.axis]
    out.append(tf.transpose(v, perm))
  return tuple(out)


def select_key(views, key):
  """psi(x, key): the slices of one key from `server_views(...)`."""
  return tuple(tf.gather(v, key) for v in views)


def assemble(spec: SelectSpec, group: SelectGroup, stacked):
  """Client side: [m, *slice_shape] per slice -> the sub-model variables."""
  out = []
  m = group.keys_per_client
  for s, x in zip(group.slices, stacked):
    # [m, ..., B, ...] -> [..., m, B, ...] -> [..., m*B, ...] -> variable shape
    rank = len(s.view_shape)
    perm = list(range(1, s.axis + 1)) + [0] + list(range(s.axis + 1, rank + 1))
    x = tf.transpose(x, perm)
    x = tf.reshape(x, s.sub_view_shape(m * group.bucket_size))
    out.append(tf.reshape(x, s.sub_shape(m * group.bucket_size)))
  return tuple(out)


def disassemble(spec: SelectSpec, group: SelectGroup, sub_vars):
  """Inverse of `assemble`: sub-model variables -> [m, *slice_shape] each."""
  out = []
  m, b = group.keys_per_client, group.bucket_size
  for s, x in zip(group.slices, sub_vars):
    view = list(s.sub_view_shape(m * b))
    split = view[:s.axis] + [m, b] + view[s.axis + 1:]
    x = tf.reshape(x, split)
    perm = [s.axis] + [i for i in range(len(split)) if i != s.axis]
    out.append(tf.transpose(x, perm))
  return tuple(out)


def select_sub_model(spec: SelectSpec, trainable, keys_by_group):
  """All of psi at once (for tests and Python): full trainable -> sub trainable."""
  sub = list(trainable)
  for group in spec.groups:
    views = server_views(spec, group, trainable)
    keys = tf.convert_to_tensor(keys_by_group[group.name], tf.int32)
    stacked = tuple(tf.gather(v, keys) for v in views)
    for s, x in zip(group.slices, assemble(spec, group, stacked)):
      sub[s.index] = x
  return sub


def scatter_to_views(spec: SelectSpec, group: SelectGroup, keys, stacked,
                     weight=1.0):
  """phi for one client: (keys, [m, ...] slices) -> dense [num_keys, ...] views.

  Returns (weighted dense views, per-key weight [num_keys]).
  """
  keys = tf.reshape(tf.cast(keys, tf.int32), [-1, 1])
  dense = []
  for s, x in zip(group.slices, stacked):
    shape = [group.num_keys] + list(s.slice_shape(group.bucket_size))
    dense.append(tf.scatter_nd(keys, tf.cast(weight, x.dtype) * x, shape))
  counts = tf.scatter_nd(
      keys, tf.fill([tf.shape(keys)[0]], tf.cast(weight, tf.float32)),
      [group.num_keys])
  return tuple(dense), counts


def views_to_variables(spec: SelectSpec, group: SelectGroup, views):
  """Inverse of `server_views`: [num_keys, ...] views -> full variables."""
  out = []
  for s, v in zip(group.slices, views):
    rank = len(s.view_shape) + 1
    # [num_keys, ..., B, ...] -> [..., num_keys, B, ...]
    perm = list(range(1, s.axis + 1)) + [0] + list(range(s.axis + 1, rank))
    v = tf.transpose(v, perm)
    out.append(tf.reshape(v, s.shape))
  return tuple(out)


# ---------------------------------------------------------------------------
# The client's sub-model and data.
def build_client_keras_model(keras_model_fn: Callable[[], tf.keras.Model],
                             spec: SelectSpec) -> tf.keras.Model:
  """The task's Keras model with every selected layer narrowed to m*B."""
  model = keras_model_fn()
  narrow = {}
  scale = {}
  input_dim = None
  for group in spec.groups:
    n = group.client_indices
    for name in group.layers:
      narrow[name] = n
      if group.output_scale != 1.0:
        scale[name] = group.output_scale
    if group.input_role == 'features':
      input_dim = n
  norm_after = {}
  for group in spec.groups:
    if group.kind != UNITS:
      continue
    for layer in model.layers:
      for s in group.slices:
        if any(w.name == s.name for w in layer.trainable_weights) and isinstance(
            layer, tf.keras.layers.GroupNormalization):
          norm_after[layer.name] = group.client_indices

  def clone(layer):
    config = layer.get_config()
    if layer.name in narrow:
      n = narrow[layer.name]
      if isinstance(layer, tf.keras.layers.Embedding):
        config['input_dim'] = n
      elif isinstance(layer, tf.keras.layers.Conv2D):
        config['filters'] = n
      elif isinstance(layer, tf.keras.layers.Dense):
        if not (input_dim is not None and _is_model_input_layer(model, layer)):
          config['units'] = n
    if layer.name in norm_after:
      # Random filters break GroupNorm's groups; keep groups that divide m*B.
      config['groups'] = math.gcd(config['groups'], norm_after[layer.name])
    new = layer.__class__.from_config(config)
    if layer.name in scale:
      # Inverted dropout: the m*B kept units stand in for all K. Scaling the
      # activation (not a weight) keeps the gradients those of dropout.
      activation, factor = new.activation, scale[layer.name]
      new.activation = lambda x: activation(x) * factor
    return new

  input_tensors = None
  if input_dim is not None:
    shape = list(model.inputs[0].shape[1:])
    shape[-1] = input_dim
    input_tensors = [tf.keras.Input(shape=shape, dtype=model.inputs[0].dtype,
                                    name=model.inputs[0].name.split(':')[0])]
  sub = tf.keras.models.clone_model(model, input_tensors=input_tensors,
                                    clone_function=clone)
  return sub


def client_input_spec(input_spec, spec: SelectSpec):
  """The element spec of the client's remapped data."""
  x, y = _xy(input_spec)
  for group in spec.groups:
    if group.input_role == 'features':
      x = tf.TensorSpec(list(x.shape[:-1]) + [group.client_indices], x.dtype)
    if group.output_role == 'classes' and y.dtype.is_floating:
      y = tf.TensorSpec(list(y.shape[:-1]) + [group.client_indices], y.dtype)
  return _like(input_spec, x, y)


def _xy(batch):
  if isinstance(batch, collections.abc.Mapping):
    return batch['x'], batch['y']
  return batch[0], batch[1]


def _like(batch, x, y):
  if isinstance(batch, collections.abc.Mapping):
    out = collections.OrderedDict(batch)
    out['x'], out['y'] = x, y
    return out
  return (x, y)


def _key_match(group: SelectGroup, keys, ids):
  """(ids, match[..., m]): which of the client's keys each global index falls in."""
  ids = tf.cast(ids, tf.int32)
  keys = tf.cast(keys, tf.int32)
  return ids, tf.equal(tf.expand_dims(ids // group.bucket_size, -1), keys)


def selected(group: SelectGroup, keys, ids):
  """Whether each global index `ids` is among the client's selected indices."""
  return tf.reduce_any(_key_match(group, keys, ids)[1], axis=-1)


def local_indices(group: SelectGroup, keys, ids):
  """Global indices `ids` -> the client's local indices (key-major)."""
  b = group.bucket_size
  keys = tf.cast(keys, tf.int32)
  ids, match = _key_match(group, keys, ids)
  found = tf.reduce_any(match, axis=-1)
  pos = tf.cast(tf.argmax(tf.cast(match, tf.int32), axis=-1), tf.int32)
  local = pos * b + ids % b
  if group.oov_index is not None:
    oov = tf.cast(tf.argmax(tf.cast(tf.equal(keys, group.oov_index // b), tf.int32)),
                  tf.int32) * b + group.oov_index % b
  else:
    oov = tf.constant(0, tf.int32)
  return tf.where(found, local, oov)


def feature_indices(group: SelectGroup, keys):
  """The m*B global feature indices of the client's keys, in local order."""
  b = group.bucket_size
  keys = tf.cast(keys, tf.int32)
  return tf.reshape(tf.expand_dims(keys, 1) * b + tf.range(b), [-1])


def remap_batch(spec: SelectSpec, keys_by_group, batch):
  """A batch of the task's data -> a batch for the client's sub-model.

  Examples whose class (one class id per example) the client did not select
  are dropped when the output group has no OOV class: mapping them to local 0
  would train them as whatever real class the client's first key names.
  """
  x, y = _xy(batch)
  keep = None
  for group in spec.groups:
    if _drops_unselected_classes(group, y):
      keep = selected(group, keys_by_group[group.name], y)
  for group in spec.groups:
    keys = keys_by_group[group.name]
    if group.input_role == 'tokens':
      x = tf.cast(local_indices(group, keys, x), x.dtype)
    elif group.input_role == 'features':
      x = tf.gather(x, feature_indices(group, keys), axis=-1)
    if group.output_role == 'classes':
      if y.dtype.is_floating:  # one-hot / multi-hot labels: keep selected
        y = tf.gather(y, feature_indices(group, keys), axis=-1)
      else:  # class ids: the client's softmax is over its selected outputs
        y = tf.cast(local_indices(group, keys, y), y.dtype)
  if keep is not None:
    x = tf.nest.map_structure(lambda t: tf.boolean_mask(t, keep), x)
    y = tf.boolean_mask(y, keep)
  return _like(batch, x, y)


def _drops_unselected_classes(group: SelectGroup, y) -> bool:
  """Whether examples of classes outside the keys go (one class id each, no OOV)."""
  return (group.output_role == 'classes' and group.oov_index is None
          and not y.dtype.is_floating and y.shape.rank == 1)


def drops_examples(spec: SelectSpec, element_spec) -> bool:
  """Whether `remap_batch` drops examples of data with this element spec."""
  _, y = _xy(element_spec)
  return any(_drops_unselected_classes(group, y) for group in spec.groups)


def client_dataset(spec: SelectSpec, keys_by_group, dataset):
  """The client's data for its sub-model: `remap_batch` on every batch.

  Where examples are dropped, a batch can be left with none (a random key set
  that misses every class of the batch); such batches are filtered out: an
  empty step trains nothing, and oneDNN's convolution rejects an empty batch
  (TF 2.14: "Must provide as many biases ... [0,28,28,1]").
  """
  def element(batch):  # tf.data unpacks tuple elements into arguments.
    return batch if len(batch) > 1 else batch[0]

  remapped = dataset.map(lambda *b: remap_batch(spec, keys_by_group, element(b)))
  if not drops_examples(spec, dataset.element_spec):
    return remapped

  def nonempty(*batch):
    _, y = _xy(element(batch))
    return tf.shape(y)[0] > 0

  return remapped.filter(nonempty)


def client_params(spec: SelectSpec) -> int:
  """Trainable parameters a client holds: its slices plus broadcast variables."""
  total = 0
  for i in spec.broadcast_indices:
    total += int(np.prod(spec.trainable_shapes[i]))
  for group in spec.groups:
    for s in group.slices:
      total += int(np.prod(s.sub_shape(group.client_indices)))
  return total


def is_structured_layer(model: tf.keras.Model, name: str) -> bool:
  """Whether data can name this layer's keys (embedding, input or output dense)."""
  layer = model.get_layer(name)
  if isinstance(layer, tf.keras.layers.Embedding):
    return True
  return isinstance(layer, tf.keras.layers.Dense) and (
      _is_output_layer(model, layer) or _is_model_input_layer(model, layer))


def group_configs(model: tf.keras.Model, layers: Sequence[str],
                  keys_per_client: int, policy: str, bucket_size: int = 1,
                  oov_index: Optional[int] = None, rescale: bool = False) -> list:
  """`GroupConfig`s for `--select_layer`, `--select_keys`, `--select_policy`.

  The structured layers named (embedding / input dense / output dense) share
  one key space (a vocabulary); every inner layer (conv, hidden dense) has its
  own random key space. `top`/`random_top` need structured layers only;
  `random` draws every group's keys uniformly; `mixed` needs both kinds and
  gives the inner layers the same fraction of keys as the structured ones
  (the paper's alpha: m = alpha*n structured and d = alpha*h random keys).
  `rescale`: random (inner-layer) groups scale their activations on the
  client by K / (m*B) (`SelectGroup.output_scale`), except where a
  normalization layer follows (it would normalize the scale away).
  """
  known = selectable_layers(model)
  if not layers:
    raise ValueError('--select_layer is empty; valid values: ' + ', '.join(known))
  for name in layers:
    if name not in known:
      raise ValueError(
          f'--select_layer={name!r} is not a selectable layer of {model.name}; '
          f'valid values: {", ".join(known)}')
  structured = [n for n in layers if is_structured_layer(model, n)]
  inner = [n for n in layers if n not in structured]
  if policy in ('top', 'random_top') and inner:
    raise ValueError(
        f'--select_policy={policy} needs structured layers (embedding, input or '
        f'output dense); {", ".join(inner)} are inner layers: use '
        '--select_policy=random or mixed')
  if policy == 'mixed' and (not structured or not inner):
    raise ValueError(
        '--select_policy=mixed needs both structured layers (embedding/output) '
        f'and inner layers in --select_layer; got structured={structured}, '
        f'inner={inner}')

  def size(name):
    layer = model.get_layer(name)
    if isinstance(layer, tf.keras.layers.Embedding):
      return int(layer.embeddings.shape[0])
    if isinstance(layer, tf.keras.layers.Dense) and _is_model_input_layer(
        model, layer):
      return int(layer.kernel.shape[0])
    return int(layer.kernel.shape[-1])

  configs = []
  first_size = None
  if structured:
    first_size = size(structured[0])
    configs.append(GroupConfig(structured, keys_per_client, structured=True,
                               bucket_size=bucket_size, oov_index=oov_index))
  for name in inner:
    if first_size is None:
      m, b = keys_per_client, bucket_size
      first_size = size(name)
    else:  # same fraction alpha of this layer's units, whole units
      m = max(1, round(keys_per_client * size(name) / first_size))
      b = 1
    # After a normalization layer an activation scale would be normalized
    # away before the next layer: such groups keep 1.0 (not rescaled).
    norm = _norm_in_chain(model.get_layer(name))
    scale = size(name) / (m * b) if rescale and not norm else 1.0
    configs.append(GroupConfig([name], m, structured=False, bucket_size=b,
                               output_scale=scale))
  return configs
