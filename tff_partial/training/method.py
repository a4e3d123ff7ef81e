"""What every training method hands to the one training loop.

A method (FedAvg, FedPT, PVT, federated select) is built from a
`MethodContext` (task, optimizers, aggregator, seed) into a `BuiltMethod`: the
`tff.learning.templates.LearningProcess` plus the numbers the `--dry_run`
contract of DESIGN.md reports (parameter counts, exact bytes per client).
"""

import dataclasses
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import registry
from tff_partial.measure import comm

AggregationFactory = Union[
    tff.aggregators.WeightedAggregationFactory,
    tff.aggregators.UnweightedAggregationFactory,
]

# client_input_fn(round_num, client_index, client_id, dataset) -> the value the
# process's `next` takes for that client (default: the dataset itself).
ClientInputFn = Callable[[int, int, str, tf.data.Dataset], Any]


@dataclasses.dataclass(frozen=True)
class MethodContext:
  """Inputs shared by every method builder."""

  task: registry.Task
  client_optimizer: tff.learning.optimizers.Optimizer
  server_optimizer: tff.learning.optimizers.Optimizer
  model_aggregator: Optional[AggregationFactory] = None
  seed: int = 0
  clients_per_round: int = 10
  total_rounds: int = 1
  # How a client iterates its dataset. TFF's default is DATASET_REDUCE;
  # DATASET_ITERATOR runs the same steps in the same order and is several
  # times faster on CPU for conv models (docs/benchmarks.md); the binaries
  # default to it (--client_loop).
  loop_implementation: tff.learning.LoopImplementation = (
      tff.learning.LoopImplementation.DATASET_REDUCE)


@dataclasses.dataclass(frozen=True)
class BuiltMethod:
  """A built method.

  Attributes:
    name: algorithm name (`fedavg`, `fedpt`, `pvt`, `select`).
    process: the `LearningProcess`; `get_model_weights(state)` returns the
      full server model (all variables, in Keras `model.weights` order split
      into trainable / non-trainable as TFF does).
    params_total: parameters of the server model.
    params_trainable: parameters a client trains per round.
    client_model_params: parameters a client holds (receives or regenerates).
    bytes: exact per-client bytes of one round, from the process's types.
    bytes_note: how to read `bytes` when it is not what TFF's types say
      (e.g. PVT accounts only the trained variables a real client sends).
    client_input_fn: maps (round, client index, client id, dataset) to the
      client value `process.next` takes; None means the dataset itself.
    extra_report: more `--dry_run` keys, method-specific.
    client_trained_mask_fn: (round, client index) -> one bool per
      `task.keras_model_fn().trainable_weights`: the variables that client
      trains (what its gradient step differentiates). None: every variable.
      Used to measure client training memory (`tff_partial.measure.memory`).
    client_model_is_task_model: False when a client trains a different (e.g.
      sliced) model than the task's Keras model, so the task model's memory
      does not describe a client (federated select).
  """

  name: str
  process: tff.learning.templates.LearningProcess
  params_total: int
  params_trainable: int
  client_model_params: int
  bytes: comm.ClientBytes
  bytes_note: str = ''
  client_input_fn: Optional[ClientInputFn] = None
  extra_report: dict = dataclasses.field(default_factory=dict)
  client_trained_mask_fn: Optional[Callable[[int, int], Sequence[bool]]] = None
  client_model_is_task_model: bool = True


def count_params(weights) -> int:
  """Parameters in a TFF type, or a structure of tensors / variables / arrays."""
  if isinstance(weights, tff.types.Type):
    leaves = comm.tensor_leaves(weights)
  else:
    leaves = tf.nest.flatten(weights)
  return sum(int(np.prod(w.shape, dtype=np.int64)) for w in leaves)


def model_weights_type(task: registry.Task):
  """`tff.learning` model weights type of the task's model."""
  return tff.learning.models.weights_type_from_model(task.baseline.model_fn)


def dry_run_report(
    built: BuiltMethod,
    task: registry.Task,
    epsilon: Optional[float],
) -> dict:
  """The `--dry_run` JSON object of DESIGN.md for a built method."""
  reference = comm.fedavg_bytes(model_weights_type(task))
  own = built.bytes.down_payload + built.bytes.up_payload
  report = {
      'task': task.name,
      'algorithm': built.name,
      'params_total': built.params_total,
      'params_trainable': built.params_trainable,
      'trainable_fraction': built.params_trainable / built.params_total,
      'client_model_fraction': built.client_model_params / built.params_total,
      'bytes_down_per_client': built.bytes.down_payload,
      'bytes_up_per_client': built.bytes.up_payload,
      'bytes_down_overhead_per_client': built.bytes.down_overhead,
      'bytes_up_overhead_per_client': built.bytes.up_overhead,
      'comm_reduction_vs_fedavg': (
          (reference.down_payload + reference.up_payload) / own
          if own else None
      ),
      'epsilon': epsilon,
      'population': task.population,
      'data_source': task.data_source,
  }
  if built.bytes_note:
    report['bytes_note'] = built.bytes_note
  report.update(built.extra_report)
  return report
