"""Keras `fit` alone, timed per round, as the benchmark's keras_in_memory does it.

Run from the repository root: python docs/benchmark_results/issue17_keras_standalone.py
(16 rounds of emnist_cnn_gn on the FEMNIST sample, 10 writers per round; prints the seconds).
"""
import os, sys, time, statistics
sys.path.insert(0, os.getcwd())
import tensorflow as tf
from tests import testing_utils
from tff_partial.bench import references, cohorts
task = testing_utils.femnist_task('emnist_cnn_gn')
ids = list(task.train_data.client_ids)
tf.keras.utils.set_random_seed(0)
model = task.keras_model_fn()
model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss=task.loss_fn())
ts = []
for r in range(16):
  cohort = cohorts.sample_cohort(ids, 0, r, 10)
  ds = references.in_memory(references.round_dataset(task, cohort))
  t0 = time.perf_counter()
  model.fit(ds, epochs=1, verbose=0)
  ts.append(time.perf_counter() - t0)
print('fit', [round(t, 2) for t in ts], 'median', round(statistics.median(ts[1:]), 3))
