"""Exact bytes sent down to and up from each client, from a computation's types.

Nothing is estimated: we walk the building block of a TFF computation (e.g. a
`LearningProcess.next`) and add up the sizes of the values that cross the
server/client boundary:

* down: the result of every `federated_broadcast` and `federated_value` placed
  at clients, and of every `federated_select` / `federated_secure_select`
  (the per-key value type times the number of keys each client asks for, which
  TFF's types fix statically);
* up: the client-placed operand of every aggregating intrinsic
  (`federated_sum`, `federated_mean`, `federated_weighted_mean`,
  `federated_aggregate`, the secure sums) and the keys a client sends to
  `federated_select`.

Leaves are split in two: the *payload* (tensors of rank >= 1: model weights,
updates, select keys, the FedPT seed `int32[2]`) and the *overhead* (scalars:
learning rates, clip norms, aggregation weights; and every metric sum: an
aggregated struct with a top-level `num_examples` field is the metrics that
`tff.learning` models always report, whatever the rank of its states, e.g.
the thresholds of a precision metric). The contract
keys `bytes_down_per_client` / `bytes_up_per_client` are the payload; the
overhead is reported beside it so nothing is hidden.

TFF has no such accounting (its `tff.program` measurements are byte-free), so
this walk is written here by hand.
"""

import dataclasses
from typing import Any

import numpy as np
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.compiler import building_blocks
from tensorflow_federated.python.core.impl.compiler import tree_analysis

_DOWN_URIS = ('federated_broadcast', 'federated_value_at_clients')
_SELECT_URIS = ('federated_select', 'federated_secure_select')
_UP_URIS = (
    'federated_sum',
    'federated_mean',
    'federated_weighted_mean',
    'federated_aggregate',
    'federated_secure_sum',
    'federated_secure_sum_bitwidth',
    'federated_secure_modular_sum',
    'federated_min',
    'federated_max',
)


@dataclasses.dataclass(frozen=True)
class ClientBytes:
  """Bytes per client per round. `*_payload` are the contract's numbers."""

  down_payload: int = 0
  down_overhead: int = 0
  up_payload: int = 0
  up_overhead: int = 0

  @property
  def down_total(self) -> int:
    return self.down_payload + self.down_overhead

  @property
  def up_total(self) -> int:
    return self.up_payload + self.up_overhead

  def __add__(self, other: 'ClientBytes') -> 'ClientBytes':
    return ClientBytes(
        *(getattr(self, f.name) + getattr(other, f.name)
          for f in dataclasses.fields(self))
    )


def tensor_leaves(type_spec) -> list[tff.TensorType]:
  """All tensor leaves of a (possibly federated, struct or sequence) type."""
  if isinstance(type_spec, tff.FederatedType):
    return tensor_leaves(type_spec.member)
  if isinstance(type_spec, tff.TensorType):
    return [type_spec]
  if isinstance(type_spec, tff.StructType):
    out = []
    for _, member in tff.structure.iter_elements(type_spec):
      out.extend(tensor_leaves(member))
    return out
  if isinstance(type_spec, tff.SequenceType):
    raise ValueError(
        f'a sequence type {type_spec} crosses the client boundary; its size '
        'is not static'
    )
  return []


def tensor_bytes(tensor_type: tff.TensorType) -> int:
  """Exact bytes of one fully defined tensor type."""
  shape = tensor_type.shape
  if shape is None or any(d is None for d in shape):
    raise ValueError(f'tensor type {tensor_type} has no static size')
  return int(np.prod(shape, dtype=np.int64)) * np.dtype(tensor_type.dtype).itemsize


def type_bytes(type_spec) -> int:
  """Exact bytes of every tensor in `type_spec` (any TFF type)."""
  return sum(tensor_bytes(t) for t in tensor_leaves(type_spec))


def _split(type_spec, multiplier: int = 1) -> tuple[int, int]:
  payload = overhead = 0
  for t in tensor_leaves(type_spec):
    if t.shape is not None and len(t.shape) >= 1:
      payload += tensor_bytes(t) * multiplier
    else:
      overhead += tensor_bytes(t) * multiplier
  return payload, overhead


def _is_metrics(type_spec) -> bool:
  if not isinstance(type_spec, tff.StructType):
    return False
  names = [name for name, _ in tff.structure.iter_elements(type_spec)]
  return 'num_examples' in names


def _first_client_operand(parameter_type):
  """The client-placed part of an intrinsic's parameter."""
  if isinstance(parameter_type, tff.FederatedType):
    return parameter_type if parameter_type.placement is tff.CLIENTS else None
  if isinstance(parameter_type, tff.StructType):
    for _, member in tff.structure.iter_elements(parameter_type):
      if (isinstance(member, tff.FederatedType)
          and member.placement is tff.CLIENTS):
        return member
  return None


def client_bytes(computation: Any) -> ClientBytes:
  """Bytes per client per invocation of `computation` (a `tff.Computation`)."""
  block = computation.to_building_block()
  totals = {'dp': 0, 'do': 0, 'up': 0, 'uo': 0}

  def visit(node):
    if not isinstance(node, building_blocks.Intrinsic):
      return
    uri = node.uri
    fn_type = node.type_signature
    if uri in _DOWN_URIS:
      result = fn_type.result
      if isinstance(result, tff.FederatedType) and result.placement is tff.CLIENTS:
        p, o = _split(result)
        totals['dp'] += p
        totals['do'] += o
    elif uri in _SELECT_URIS:
      # (<keys@CLIENTS, max_key@SERVER, server_val@SERVER, select_fn>
      #   -> {T*}@CLIENTS): each client receives len(keys) values of type T.
      keys_type = fn_type.parameter[0]
      keys_leaf = tensor_leaves(keys_type)[0]
      num_keys = int(np.prod(keys_leaf.shape, dtype=np.int64))
      per_key = fn_type.result.member.element
      p, o = _split(per_key, multiplier=num_keys)
      totals['dp'] += p + o  # each selected value is payload, scalar or not
      totals['up'] += tensor_bytes(keys_leaf)  # the keys go up
    elif uri in _UP_URIS:
      operand = _first_client_operand(fn_type.parameter)
      if operand is not None:
        p, o = _split(operand)
        if _is_metrics(operand.member):
          p, o = 0, p + o
        totals['up'] += p
        totals['uo'] += o

  tree_analysis.visit_postorder(block, visit)
  return ClientBytes(
      down_payload=totals['dp'],
      down_overhead=totals['do'],
      up_payload=totals['up'],
      up_overhead=totals['uo'],
  )


def fedavg_bytes(model_weights_type) -> ClientBytes:
  """What TFF's FedAvg moves for a model: all weights down, trainable up.

  `model_weights_type` is `tff.learning.models.weights_type_from_model(...)`.
  Only the payload is computed (FedAvg's scalars are the same for every
  method); this is the reference for `comm_reduction_vs_fedavg`.
  """
  down, _ = _split(model_weights_type)
  up, _ = _split(model_weights_type.trainable)
  return ClientBytes(down_payload=down, up_payload=up)
