"""Issue 17: tf.data's autotuning in the clients' datasets and in the limit.

Runs `scripts.benchmark` with every flag it is given plus one configuration,
`fedavg_autotune_off`: the package's FedAvg with tf.data's autotuning turned
off in each client's dataset (`Dataset.with_options`), the rest as `fedavg`.
With `--benchmark_references=...,keras_in_memory_autotune` the limit with
autotuning on (Keras's default) runs beside the one with it off.

    python docs/benchmark_results/issue17_autotune.py --task=emnist_cnn_gn \
        --data_source=leaf --data_dir=../shared/data/femnist_leaf_sample.tar.xz \
        --clients_per_round=10 --benchmark_rounds=11 \
        --benchmark_configs=tff_fedavg,tff_fedavg_iterator,fedavg \
        --benchmark_config=fedavg_autotune_off:fedavg \
        --benchmark_references=keras_in_memory,keras_in_memory_autotune,keras_tff_data_path,tf_function_floor \
        --nobenchmark_memory --nobenchmark_eval --output_dir=/tmp/bench_autotune
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))

from absl import app  # pylint: disable=g-import-not-at-top
import tensorflow as tf

from scripts import benchmark

AUTOTUNE_OFF = 'fedavg_autotune_off'
_build_candidates = benchmark.build_candidates


def _autotune_off(inputs_fn):
  options = tf.data.Options()
  options.autotune.enabled = False

  def inputs(*args, **kwargs):
    return [d.with_options(options) for d in inputs_fn(*args, **kwargs)]

  return inputs


def build_candidates(configs, task, ctx, seed):
  """`benchmark.build_candidates`; `fedavg_autotune_off`'s client datasets
  with autotuning off."""
  candidates, skipped = _build_candidates(configs, task, ctx, seed)
  for c in candidates:
    if c.name == AUTOTUNE_OFF:
      c.inputs_fn = _autotune_off(c.inputs_fn)
  return candidates, skipped


benchmark.build_candidates = build_candidates

if __name__ == '__main__':
  app.run(benchmark.main)
