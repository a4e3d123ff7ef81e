"""Issue 17: clients' models built with zeros instead of their initializers.

Since this change the package's FedAvg, FedPT, PVT and select build each
client's model with `tff_partial.training.client_model.zero_initialized` (the
broadcast weights overwrite the initial values). This runs `scripts.benchmark`
with every flag it is given plus one configuration, `fedavg_model_init`: the
package's FedAvg built as before, its clients running the model's random
initializers on every call. Both run side by side, interleaved round by
round, with the references.

    python docs/benchmark_results/issue17_client_zero_init.py --task=emnist_cnn_gn \
        --data_source=leaf --data_dir=../shared/data/femnist_leaf_sample.tar.xz \
        --clients_per_round=10 --benchmark_rounds=11 \
        --benchmark_configs=tff_fedavg,tff_fedavg_iterator,fedavg \
        --benchmark_config=fedavg_model_init:fedavg \
        --nobenchmark_memory --nobenchmark_eval --output_dir=/tmp/bench_zero_init
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))

from absl import app  # pylint: disable=g-import-not-at-top

from scripts import benchmark
from tff_partial.training import client_model

MODEL_INIT = 'fedavg_model_init'
_build_config = benchmark.build_config


def build_config(config, ctx):
  """`benchmark.build_config`; `fedavg_model_init` without the zeros."""
  if config.name != MODEL_INIT:
    return _build_config(config, ctx)
  zero_initialized = client_model.zero_initialized
  client_model.zero_initialized = lambda model_fn: model_fn
  try:
    return _build_config(config, ctx)
  finally:
    client_model.zero_initialized = zero_initialized


benchmark.build_config = build_config

if __name__ == '__main__':
  app.run(benchmark.main)
