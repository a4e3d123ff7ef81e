"""Variable types of Partial Variable Training (PVT).

Yang, Guliani, Beaufays, Motta: *Partial Variable Training for Efficient
On-Device Federated Learning* (ICASSP 2022), section 2.1, types every variable
of a network by the role it plays in its layer:

* additive vector (`ADDITIVE_VECTOR`): adds a constant per channel (biases,
  normalization offsets `beta`); cheap in memory and communication;
* multiplicative vector (`MULTIPLICATIVE_VECTOR`): scales each channel
  (normalization scales `gamma`); cheap to send, but its gradient needs the
  buffered input activations;
* multiplicative matrix (`MULTIPLICATIVE_MATRIX`): multiplies the input
  (dense / convolution / einsum kernels, recurrent kernels, embeddings);
  dominates both memory and communication.

The type is decided by the Keras layer class and by which attribute of the
layer the variable is (`Dense.kernel`, `GroupNormalization.gamma`, ...), not by
the variable's name: `classify_variables(model)` walks every (nested) layer of a
Keras model, including the inner `EinsumDense` layers of `MultiHeadAttention`
and the cells of recurrent layers, and returns the types aligned with
`model.trainable_weights`, which is the order of
`tff.learning.models.ModelWeights.trainable` for a model built with
`tff.learning.models.from_keras_model`. A variable of a layer kind this table
does not know raises a `ValueError` naming it; type it with `overrides` (one
model) or `register_layer_roles` (a custom layer class).
"""

import enum
from typing import Mapping, Optional, Sequence

import tensorflow as tf


class VariableType(enum.Enum):
  ADDITIVE_VECTOR = 'additive_vector'
  MULTIPLICATIVE_VECTOR = 'multiplicative_vector'
  MULTIPLICATIVE_MATRIX = 'multiplicative_matrix'


ADDITIVE_VECTOR = VariableType.ADDITIVE_VECTOR
MULTIPLICATIVE_VECTOR = VariableType.MULTIPLICATIVE_VECTOR
MULTIPLICATIVE_MATRIX = VariableType.MULTIPLICATIVE_MATRIX

_L = tf.keras.layers

# (layer classes, {attribute: type}). Subclasses match (e.g. every Conv1D/2D/3D
# and transposed conv derive from Keras' base `Conv`; DepthwiseConv2D and the
# separable convs have their own kernel attributes, listed here too).
_ROLE_TABLE = (
    ((_L.Dense, _L.EinsumDense),
     {'kernel': MULTIPLICATIVE_MATRIX, 'bias': ADDITIVE_VECTOR}),
    ((_L.Conv1D, _L.Conv2D, _L.Conv3D, _L.Conv1DTranspose, _L.Conv2DTranspose,
      _L.Conv3DTranspose, _L.DepthwiseConv2D, _L.SeparableConv1D,
      _L.SeparableConv2D),
     {'kernel': MULTIPLICATIVE_MATRIX,
      'depthwise_kernel': MULTIPLICATIVE_MATRIX,
      'pointwise_kernel': MULTIPLICATIVE_MATRIX,
      'bias': ADDITIVE_VECTOR}),
    ((_L.GroupNormalization, _L.LayerNormalization, _L.BatchNormalization),
     {'gamma': MULTIPLICATIVE_VECTOR, 'beta': ADDITIVE_VECTOR}),
    ((_L.Embedding,), {'embeddings': MULTIPLICATIVE_MATRIX}),
    ((_L.SimpleRNNCell, _L.GRUCell, _L.LSTMCell),
     {'kernel': MULTIPLICATIVE_MATRIX,
      'recurrent_kernel': MULTIPLICATIVE_MATRIX,
      'bias': ADDITIVE_VECTOR}),
)


# Roles of custom layer kinds, added with `register_layer_roles`.
_CUSTOM_ROLES: list = []


def register_layer_roles(layer_class, roles: Mapping[str, VariableType]) -> None:
  """Types the variables of a custom Keras layer kind by attribute.

  E.g. a learned position embedding added to its input is an additive
  vector table: `register_layer_roles(PositionEmbedding,
  {'embeddings': ADDITIVE_VECTOR})`.
  """
  if not (isinstance(layer_class, type) and issubclass(layer_class, tf.keras.layers.Layer)):
    raise ValueError(f'layer_class must be a Keras layer class, got {layer_class!r}')
  roles = {attribute: VariableType(t) for attribute, t in roles.items()}
  _CUSTOM_ROLES[:] = [(c, r) for c, r in _CUSTOM_ROLES if c is not layer_class]
  _CUSTOM_ROLES.append((layer_class, roles))


def _layers(model: tf.keras.layers.Layer):
  """The model itself and every nested Keras layer (MHA's EinsumDense, cells)."""
  seen = set()
  for module in [model, *model.submodules]:
    if isinstance(module, tf.keras.layers.Layer) and id(module) not in seen:
      seen.add(id(module))
      yield module


def _role_types(model) -> dict:
  """variable ref -> (type, 'LayerClass.attribute') from the role table."""
  typed = {}
  for layer in _layers(model):
    for classes, roles in (*_ROLE_TABLE, *_CUSTOM_ROLES):
      if not isinstance(layer, classes):
        continue
      for attribute, var_type in roles.items():
        variable = getattr(layer, attribute, None)
        if isinstance(variable, tf.Variable):
          typed[variable.ref()] = (
              var_type, f'{type(layer).__name__}.{attribute}')
  return typed


def classify_variables(
    model: tf.keras.Model,
    overrides: Optional[Mapping[str, VariableType]] = None,
) -> list[VariableType]:
  """Types of `model.trainable_weights`, in that order.

  Args:
    model: a built Keras model (its variables must exist).
    overrides: variable name (`v.name`, e.g. `'my_layer/w:0'`) -> type, for
      variables of layer kinds the role table does not know.

  Raises:
    ValueError: if the model has no variables yet, or a variable is of a layer
      kind this module cannot type and `overrides` does not name it.
  """
  overrides = dict(overrides or {})
  if not model.trainable_weights:
    raise ValueError(
        f'model {model.name!r} has no trainable variables; build it (give it an '
        'Input) before typing its variables')
  typed = _role_types(model)
  result, unknown = [], []
  for variable in model.trainable_weights:
    if variable.name in overrides:
      result.append(VariableType(overrides.pop(variable.name)))
    elif variable.ref() in typed:
      result.append(typed[variable.ref()][0])
    else:
      unknown.append(f'{variable.name} {tuple(variable.shape)}')
  if unknown:
    raise ValueError(
        'cannot type these variables by layer kind and role (known: Dense, '
        'EinsumDense, Conv*, GroupNormalization/LayerNormalization/'
        'BatchNormalization, Embedding, SimpleRNN/GRU/LSTM cells, '
        'MultiHeadAttention): ' + ', '.join(unknown)
        + '; pass overrides={name: VariableType} to type them')
  if overrides:
    raise ValueError(
        f'overrides name variables the model does not have: {sorted(overrides)}')
  return result


def describe(model: tf.keras.Model) -> list[tuple[str, str, str, tuple]]:
  """(variable name, 'Layer.attribute', type value, shape) per trainable variable."""
  typed = _role_types(model)
  types = classify_variables(model)
  return [
      (v.name, typed.get(v.ref(), (None, 'override'))[1], t.value,
       tuple(v.shape))
      for v, t in zip(model.trainable_weights, types)
  ]


DEFAULT_FREEZABLE = (MULTIPLICATIVE_VECTOR, MULTIPLICATIVE_MATRIX)


def freezable_indices(
    types: Sequence[VariableType],
    freezable_types: Sequence[VariableType] = DEFAULT_FREEZABLE,
) -> list[int]:
  """Indices of the freezable variables (the paper's default: all but additive)."""
  freezable_types = tuple(VariableType(t) for t in freezable_types)
  return [i for i, t in enumerate(types) if t in freezable_types]
