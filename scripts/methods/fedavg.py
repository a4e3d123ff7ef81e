"""FedAvg: TFF's own `tff.learning.algorithms.build_weighted_fed_avg`.

Its clients build their model without the initializers' random draws
(`client_model.zero_initialized`: the broadcast weights overwrite them); the
server's initial model is the task model's own initialization
(`client_model.with_initial_weights`).
"""

import tensorflow_federated as tff

from tff_partial.measure import comm
from tff_partial.training import client_model
from tff_partial.training import method

FLAG_NAMES = ()


def validate_flags() -> None:
  pass


def build(ctx: method.MethodContext) -> method.BuiltMethod:
  aggregator = ctx.model_aggregator
  model_fn = ctx.task.baseline.model_fn
  if isinstance(aggregator, tff.aggregators.UnweightedAggregationFactory):
    process = tff.learning.algorithms.build_unweighted_fed_avg(
        client_model.zero_initialized(model_fn),
        client_optimizer_fn=ctx.client_optimizer,
        server_optimizer_fn=ctx.server_optimizer,
        model_aggregator=aggregator,
        loop_implementation=ctx.loop_implementation,
    )
  else:
    process = tff.learning.algorithms.build_weighted_fed_avg(
        client_model.zero_initialized(model_fn),
        client_optimizer_fn=ctx.client_optimizer,
        server_optimizer_fn=ctx.server_optimizer,
        model_aggregator=aggregator,
        loop_implementation=ctx.loop_implementation,
    )
  process = client_model.with_initial_weights(process, model_fn)
  weights_type = method.model_weights_type(ctx.task)
  params = method.count_params(weights_type)
  return method.BuiltMethod(
      name='fedavg',
      process=process,
      params_total=params,
      params_trainable=method.count_params(weights_type.trainable),
      client_model_params=params,
      bytes=comm.client_bytes(process.next),
  )
