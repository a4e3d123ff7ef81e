"""Which layers FedPT freezes: by name, by regex, or by a trainable-fraction target.

FedPT (Sidahmed et al.), section 3 and appendix B: freeze the large layers
(EMNIST CNN `dense1`, ResNet-18 residual convolutions, the transformer's FFN
first layers), keep normalization layers trainable (they are tiny and the
model trains poorly without them).

Order of the trainable-fraction target (`order`): `largest_first` freezes
the largest layers first (the paper's CIFAR-10 choice: its Table 2
percentages drop by exactly what ResNet-18's block4, block3, block2 and
block1 convolutions hold, frozen in that order). `input_first` freezes a
*prefix* of the model, every layer with weights in the order the model
applies them, normalization layers included: when nothing before a frozen
prefix trains, TensorFlow records no gradient op for the prefix (a
GradientTape only records ops with watched inputs), so the backward pass
stops at the prefix's end and a step costs less than with the same fraction
frozen largest first (which still back-propagates through every frozen
convolution to reach the trainable layers below it).

Layers are named by their stable *path* (`dense1`, `block1/conv1`; see
`regeneration.walk_layers`). Every variable of a frozen layer (and of the
layers nested in it) is frozen. Normalization layers are frozen only when
named explicitly in `layers`; `regex` and `target_trainable_fraction` skip them.
"""

import re
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_partial.frozen import regeneration

NORMALIZATION_LAYERS = (
    tf.keras.layers.BatchNormalization,
    tf.keras.layers.LayerNormalization,
    tf.keras.layers.GroupNormalization,
    tf.keras.layers.UnitNormalization,
)


LARGEST_FIRST = 'largest_first'
INPUT_FIRST = 'input_first'
ORDERS = (LARGEST_FIRST, INPUT_FIRST)


def is_normalization(layer) -> bool:
  return isinstance(layer, NORMALIZATION_LAYERS)


def _num_params(weights) -> int:
  return sum(int(np.prod(w.shape, dtype=np.int64)) for _, w in weights)


def _subtree_weights(layers, path):
  return [pw for info in layers
          if info.path == path or info.path.startswith(path + '/')
          for pw in info.weights]


def layer_names_with_weights(keras_model: tf.keras.Model) -> list[str]:
  """Paths of the layers that hold weights (themselves or nested)."""
  layers = regeneration.walk_layers(keras_model)
  return [info.path for info in layers if _subtree_weights(layers, info.path)]


def select_frozen_layers(
    keras_model: tf.keras.Model,
    layers: Sequence[str] = (),
    regex: Optional[str] = None,
    target_trainable_fraction: Optional[float] = None,
    order: str = LARGEST_FIRST,
) -> tuple[str, ...]:
  """Paths of the layers to freeze (union of the three criteria).

  Args:
    keras_model: the (uncompiled) Keras model.
    layers: layer paths, frozen as named (normalization layers included).
      An unknown name raises `ValueError` naming `--frozen_layers` and the
      model's layers.
    regex: frozen: every layer with weights whose path `re.fullmatch`es it,
      except normalization layers. Matching nothing is a `ValueError`.
    target_trainable_fraction: in (0, 1]: after the layers above, freeze
      more leaf layers, in `order`: `largest_first` freezes while at least the
      target stays trainable (never normalization layers; skipping any that
      would bring the fraction below the target); `input_first` freezes the
      shortest prefix of the model (normalization layers included) after
      which at most the target trains, so that at least 1 - target is frozen
      (a prefix cannot stop at any fraction: on ResNet-18 the last
      convolution alone holds 21% of the parameters).
    order: `largest_first` or `input_first` (see the module docstring).

  Returns:
    Sorted, de-duplicated layer paths (a nested layer inside a selected one is
    not listed separately).
  """
  infos = regeneration.walk_layers(keras_model)
  by_path = {info.path: info for info in infos}
  known = layer_names_with_weights(keras_model)
  selected = []
  for name in layers:
    if name not in known:
      raise ValueError(
          f'--frozen_layers: the model {keras_model.name!r} has no layer {name!r} '
          f'with weights; its layers are: {", ".join(known)}')
    selected.append(name)
  if regex:
    try:
      pattern = re.compile(regex)
    except re.error as e:
      raise ValueError(f'--frozen_regex={regex!r} is not a valid regex: {e}') from e
    matched = [p for p in known
               if pattern.fullmatch(p) and not is_normalization(by_path[p].layer)]
    if not matched:
      raise ValueError(
          f'--frozen_regex={regex!r} matches no non-normalization layer of '
          f'{keras_model.name!r}; its layers are: {", ".join(known)}')
    selected.extend(matched)
  if target_trainable_fraction is not None:
    if not 0.0 < target_trainable_fraction <= 1.0:
      raise ValueError(
          '--frozen_target_trainable_fraction='
          f'{target_trainable_fraction} must be in (0, 1]')
    if order == LARGEST_FIRST:
      selected.extend(_largest_first(infos, selected, target_trainable_fraction))
    elif order == INPUT_FIRST:
      selected.extend(_input_first(infos, selected, target_trainable_fraction))
    else:
      raise ValueError(f'--frozen_order={order!r}; valid values: {", ".join(ORDERS)}')
  return _minimal(selected)


def _minimal(paths) -> tuple[str, ...]:
  """Sorted unique paths, dropping those nested in another selected path."""
  unique = sorted(set(paths))
  return tuple(p for p in unique
               if not any(p.startswith(q + '/') for q in unique if q != p))


def frozen_weight_paths(keras_model, frozen_layers) -> set[str]:
  infos = regeneration.walk_layers(keras_model)
  return {path for layer in frozen_layers
          for path, _ in _subtree_weights(infos, layer)}


def _trainable_sizes(infos, already):
  """(size of each trainable weight path, total, trainable left after `already`)."""
  trainable = {path: int(np.prod(w.shape, dtype=np.int64))
               for info in infos for path, w in info.weights if w.trainable}
  total = sum(trainable.values())
  frozen = {p for layer in already for p, _ in _subtree_weights(infos, layer)}
  remaining = sum(n for p, n in trainable.items() if p not in frozen)
  return trainable, frozen, total, remaining


def _leaves(infos):
  """Layers that hold weights and have no sublayer that does, in model order."""
  return [info for info in infos
          if info.weights and not _sublayers_with_weights(infos, info.path)]


def _input_first(infos, already, target) -> list[str]:
  trainable, frozen, total, remaining = _trainable_sizes(infos, already)
  chosen = []
  for info in _leaves(infos):
    if remaining / total <= target + 1e-12:
      break  # the shortest prefix that leaves at most the target trainable
    remaining -= sum(trainable.get(p, 0) for p, _ in info.weights if p not in frozen)
    chosen.append(info.path)
  return chosen


def _largest_first(infos, already, target) -> list[str]:
  trainable, frozen, total, remaining = _trainable_sizes(infos, already)
  leaves = [info for info in _leaves(infos) if not is_normalization(info.layer)]
  sizes = []
  for info in leaves:
    size = sum(trainable.get(p, 0) for p, _ in info.weights if p not in frozen)
    if size:
      sizes.append((-size, info.path))
  chosen = []
  for neg_size, path in sorted(sizes):
    if (remaining + neg_size) / total >= target - 1e-12:
      remaining += neg_size
      chosen.append(path)
  return chosen


def _sublayers_with_weights(infos, path) -> bool:
  return any(info.path.startswith(path + '/') and info.weights for info in infos)


def trainable_fraction(keras_model, frozen_layers) -> float:
  """Trainable parameters after freezing / trainable parameters before."""
  frozen = frozen_weight_paths(keras_model, frozen_layers)
  infos = regeneration.walk_layers(keras_model)
  sizes = {p: int(np.prod(w.shape, dtype=np.int64))
           for info in infos for p, w in info.weights if w.trainable}
  total = sum(sizes.values())
  return sum(n for p, n in sizes.items() if p not in frozen) / total
