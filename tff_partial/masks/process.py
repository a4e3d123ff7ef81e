"""`build_pvt_process`: Partial Variable Training as a `LearningProcess`.

Yang, Guliani, Beaufays, Motta: *Partial Variable Training for Efficient
On-Device Federated Learning* (PVT). Composed like TFF's
`build_weighted_fed_avg` with `tff.learning.templates.compose_learning_process`:

* distributor: `tff.learning.templates.build_broadcast_process` (every client
  receives the whole model: PVT saves upload and client memory, not download);
* client work: `client_work.build_pvt_client_work` (trains the unmasked
  variables of each client's mask);
* aggregator: `masked_mean.MaskedMeanFactory` (per-variable weighted mean over
  the clients that trained the variable);
* finalizer: TFF's `build_apply_optimizer_finalizer` wrapped so that a
  variable no client trained this round keeps its value exactly.

Federated type signature of `next`:
  `(<S@SERVER, {<data=D*, mask=float32[n]*>}@CLIENTS> -> <state=S@SERVER,
    metrics=<distributor, client_work=<train>, aggregator, finalizer>@SERVER>)`
Masks come with the client data (see `schemes.MaskSampler` and the
`client_input_fn` of `scripts/methods/pvt.py`); the process itself is
stateless about them, so a resumed run only needs the round number.
"""

import collections
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_partial.masks import client_work as client_work_lib
from tff_partial.masks import masked_mean
from tff_partial.masks import masked_median
from tff_partial.training import client_model


def build_masked_finalizer(
    server_optimizer: tff.learning.optimizers.Optimizer,
    model_weights_type,
) -> tff.learning.templates.FinalizerProcess:
  """Applies the server optimizer, then restores variables nobody trained.

  `next`: `(<S@SERVER, W@SERVER, <update=W.trainable, trained=bool[n]>@SERVER>
  -> <state=S@SERVER, result=W@SERVER, measurements=M@SERVER>)`. The inner
  finalizer is TFF's `build_apply_optimizer_finalizer` unchanged; its optimizer
  state for untrained variables sees a zero update (no movement for SGD; for
  stateful optimizers their moments decay as with any zero gradient).
  """
  inner = tff.learning.templates.build_apply_optimizer_finalizer(
      server_optimizer, model_weights_type)
  n = len(model_weights_type.trainable)
  aggregate_type = tff.StructWithPythonType(
      [('update', model_weights_type.trainable),
       ('trained', tff.TensorType(np.bool_, [n]))],
      collections.OrderedDict)

  @tff.tensorflow.computation(model_weights_type, model_weights_type,
                              tff.TensorType(np.bool_, [n]))
  def keep_untrained(old, new, trained):
    old_flat = tf.nest.flatten(old.trainable)
    new_flat = tf.nest.flatten(new.trainable)
    kept = [tf.where(trained[i], b, a)
            for i, (a, b) in enumerate(zip(old_flat, new_flat))]
    return tff.learning.models.ModelWeights(
        trainable=tf.nest.pack_sequence_as(new.trainable, kept),
        non_trainable=new.non_trainable)

  @tff.federated_computation(
      inner.initialize.type_signature.result,
      tff.FederatedType(model_weights_type, tff.SERVER),
      tff.FederatedType(aggregate_type, tff.SERVER))
  def next_fn(state, weights, aggregate):
    output = inner.next(state, weights, aggregate.update)
    new_weights = tff.federated_map(
        keep_untrained, (weights, output.result, aggregate.trained))
    return tff.templates.MeasuredProcessOutput(
        output.state, new_weights, output.measurements)

  return tff.learning.templates.FinalizerProcess(
      inner.initialize, next_fn,
      get_hparams_fn=inner.get_hparams, set_hparams_fn=inner.set_hparams)


def build_pvt_process(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    *,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = None,
    client_weighting: tff.learning.ClientWeighting = tff.learning.ClientWeighting.NUM_EXAMPLES,
    metrics_aggregator=None,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE),
    static_mask: Optional[Sequence[bool]] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds the PVT `LearningProcess` (see the module docstring for types).

  Args:
    model_fn: no-arg callable returning a new `tff.learning.models.VariableModel`.
    client_optimizer_fn: `tff.learning.optimizers.Optimizer` for local training.
    server_optimizer_fn: server optimizer; default SGD with learning rate 1.0
      (TFF's FedAvg default).
    model_aggregator: a `MaskedMeanFactory` (default: with plain sums inside;
      pass `MaskedMeanFactory(value_sum_factory=...)` for a secure or DP sum),
      or a `MaskedMedianFactory` (median over each variable's trainers).
    client_weighting: `NUM_EXAMPLES` (FedAvg's default) or `UNIFORM`.
    metrics_aggregator: as in `tff.learning.algorithms.build_weighted_fed_avg`.
    loop_implementation: the clients' dataset loop (`tff.learning.LoopImplementation`).
    static_mask: every client's mask when it is known now (the `fixed`
      scheme): clients then differentiate only the trained variables.
  """
  if not callable(model_fn):
    raise ValueError(f'model_fn must be a no-arg callable, got {type(model_fn).__name__}')
  if not isinstance(client_optimizer_fn, tff.learning.optimizers.Optimizer):
    raise ValueError('client_optimizer_fn must be a tff.learning.optimizers.Optimizer')
  if server_optimizer_fn is None:
    server_optimizer_fn = tff.learning.optimizers.build_sgdm(learning_rate=1.0)
  if not isinstance(server_optimizer_fn, tff.learning.optimizers.Optimizer):
    raise ValueError('server_optimizer_fn must be a tff.learning.optimizers.Optimizer')
  if model_aggregator is None:
    model_aggregator = masked_mean.MaskedMeanFactory()
  if not isinstance(model_aggregator, (masked_mean.MaskedMeanFactory,
                                       masked_median.MaskedMedianFactory)):
    raise ValueError(
        'model_aggregator must be a MaskedMeanFactory (wrap a sum factory in it: '
        'MaskedMeanFactory(value_sum_factory=...)) or a MaskedMedianFactory, got '
        f'{type(model_aggregator).__name__}')

  @tff.tensorflow.computation()
  def initial_model_weights_fn():
    model = model_fn()
    return tff.learning.models.ModelWeights.from_model(model)

  model_weights_type = initial_model_weights_fn.type_signature.result
  distributor = tff.learning.templates.build_broadcast_process(model_weights_type)
  client_work = client_work_lib.build_pvt_client_work(
      client_model.zero_initialized(model_fn), client_optimizer_fn, client_weighting,
      metrics_aggregator, loop_implementation, static_mask)
  update_type = client_work.next.type_signature.result.result.member.update
  aggregator = model_aggregator.create(update_type, tff.TensorType(np.float32))
  finalizer = build_masked_finalizer(server_optimizer_fn, model_weights_type)
  return tff.learning.templates.compose_learning_process(
      initial_model_weights_fn, distributor, client_work, aggregator, finalizer)
