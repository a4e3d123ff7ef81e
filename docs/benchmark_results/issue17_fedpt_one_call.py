"""Issue 17: FedPT's client work as one TensorFlow computation per client, or two.

Runs `scripts.benchmark` with every flag it is given; a configuration whose
name ends in `_two_calls` is built with FedPT's client work as it was before
2026-11-26: a `federated_map` of the frozen variables' regeneration, then
TFF's `build_model_delta_client_work` (two computations per client). The
rest are built as the package builds them now (one computation per client,
`tff_partial.frozen.process._build_client_work`). Files
issue17_fedpt_one_call_2026-11-26_zen5_* were made with

    python docs/benchmark_results/issue17_fedpt_one_call.py --task=cifar10_resnet18 \
        --data_source=jpeg --data_dir=../shared/data/cifar10_jpg.tar.xz \
        --cifar10_num_clients=20 --cifar10_examples_per_client=200 --cifar10_width=64 \
        --clients_per_round=4 --benchmark_rounds=9 --benchmark_configs=fedavg \
        --benchmark_config='fedpt_blocks34:fedpt:frozen_regex=block[34][ab]_conv[12]' \
        --benchmark_config='fedpt_blocks34_two_calls:fedpt:frozen_regex=block[34][ab]_conv[12]' \
        --benchmark_config='fedpt_blocks1234:fedpt:frozen_regex=block[1-4][ab]_conv[12]' \
        --benchmark_config='fedpt_blocks1234_two_calls:fedpt:frozen_regex=block[1-4][ab]_conv[12]' \
        --benchmark_references= --nobenchmark_memory --nobenchmark_eval --output_dir=/tmp/b
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))

from absl import app  # pylint: disable=g-import-not-at-top
import tensorflow_federated as tff

from scripts import benchmark
from tff_partial.frozen import process

_one_call = process._build_client_work  # pylint: disable=protected-access
_build_candidates = benchmark.build_candidates


def _two_calls(plan, server_weights_type, model_fn, optimizer, client_weighting,
               metrics_aggregator, loop_implementation):
  """The client work before 2026-11-26: regeneration, then TFF's client work."""
  inner = tff.learning.templates.build_model_delta_client_work(
      model_fn, optimizer, client_weighting, metrics_aggregator=metrics_aggregator,
      loop_implementation=loop_implementation)

  @tff.tensorflow.computation(server_weights_type)
  def reconstruct(server_weights):
    return process.client_model_weights(plan, server_weights)

  inner_state_type, _, data_type = inner.next.type_signature.parameter

  @tff.federated_computation(
      inner_state_type, tff.FederatedType(server_weights_type, tff.CLIENTS), data_type)
  def next_fn(state, weights, client_data):
    return inner.next(state, tff.federated_map(reconstruct, weights), client_data)

  return tff.learning.templates.ClientWorkProcess(
      inner.initialize, next_fn,
      get_hparams_fn=inner.get_hparams, set_hparams_fn=inner.set_hparams)


def build_candidates(configs, task, ctx, seed):
  """`benchmark.build_candidates`, `*_two_calls` FedPT with the old client work."""
  candidates, skipped = [], {}
  for config in configs:
    process._build_client_work = (  # pylint: disable=protected-access
        _two_calls if config.name.endswith('_two_calls') else _one_call)
    try:
      c, s = _build_candidates([config], task, ctx, seed)
    finally:
      process._build_client_work = _one_call  # pylint: disable=protected-access
    candidates += c
    skipped.update(s)
  return candidates, skipped


benchmark.build_candidates = build_candidates

if __name__ == '__main__':
  app.run(benchmark.main)
