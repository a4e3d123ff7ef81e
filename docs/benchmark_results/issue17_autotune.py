"""Issue 17: tf.data's autotuning in the clients' datasets and in the limit.

Runs `scripts.benchmark` with every flag it is given; a configuration whose
name ends in `_autotune_off` (`_autotune_on`) gets tf.data's autotuning turned
off (on) in each client's dataset (`Dataset.with_options`), the rest as its
algorithm builds it. The files issue17_autotune_2026-11-25_* were made at
commit 69adc40 with `--benchmark_config=fedavg_autotune_off:fedavg`, when the
loop still left autotuning on; since then `fedavg` has it off
(`loop.autotune_off`), and `--benchmark_config=fedavg_autotune_on:fedavg`
measures the old behaviour.
With `--benchmark_references=...,keras_in_memory_autotune` the limit with
autotuning on (Keras's default) runs beside the one with it off.

    python docs/benchmark_results/issue17_autotune.py --task=emnist_cnn_gn \
        --data_source=leaf --data_dir=../shared/data/femnist_leaf_sample.tar.xz \
        --clients_per_round=10 --benchmark_rounds=11 \
        --benchmark_configs=tff_fedavg,tff_fedavg_iterator,fedavg \
        --benchmark_config=fedavg_autotune_off:fedavg \
        --benchmark_references=keras_in_memory,keras_in_memory_autotune \
        --nobenchmark_memory --nobenchmark_eval --output_dir=/tmp/bench_autotune
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))

from absl import app  # pylint: disable=g-import-not-at-top
import tensorflow as tf

from scripts import benchmark

_build_candidates = benchmark.build_candidates


def _autotune(inputs_fn, enabled):
  options = tf.data.Options()
  options.autotune.enabled = enabled

  def inputs(*args, **kwargs):
    return [d.with_options(options) for d in inputs_fn(*args, **kwargs)]

  return inputs


def build_candidates(configs, task, ctx, seed):
  """`benchmark.build_candidates`; `*_autotune_off` / `*_autotune_on` client
  datasets with autotuning off / on."""
  candidates, skipped = _build_candidates(configs, task, ctx, seed)
  for c in candidates:
    for suffix, enabled in (('_autotune_off', False), ('_autotune_on', True)):
      if c.name.endswith(suffix):
        c.inputs_fn = _autotune(c.inputs_fn, enabled)
  return candidates, skipped


benchmark.build_candidates = build_candidates

if __name__ == '__main__':
  app.run(benchmark.main)
