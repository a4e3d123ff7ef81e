"""Centralized references for a benchmark round: what one process can do.

For the clients of each round, on the same examples in the same batches
(TFF's client data path: each client's preprocessed dataset, batch size and
epochs of the task's client spec), with the client learning rate:

* `keras_in_memory` (**the honest limit**): Keras `model.fit` over the
  round's batches, materialized in memory (`Dataset.cache()`, filled before
  the timer starts), timed warm (the train function traced in the warm-up
  rounds), with tf.data's autotuning off. What this machine does centrally
  with the same model and batches.
* `keras_in_memory_autotune` (optional, not a default): the same with tf.data's
  autotuning on, Keras's default and the limit of the benchmarks before
  2026-11-25. Measured on two 2-core machines (Zen 3, Intel Xeon): when
  `fit` ends, the iterator's teardown waits for the autotuner's next wake-up,
  which comes at 10 ms x (2^k - 1) after the start (its period starts at
  10 ms and doubles), so a round that finishes its steps at 1.6 s ends at
  2.55 s. Rounds of exactly 1.27 s and 2.55 s are that wait
  (`docs/benchmarks.md`); with the data in memory the autotuner has nothing
  to tune.
* `keras_tff_data_path`: `model.fit` over a freshly built concatenation of
  the round's preprocessed TFF client datasets, timed with building and
  reading them (the reference the benchmark used before; it pays the data
  path a federated round pays too).
* `tf_function_floor`: a floor for the clients' own work: the same number
  of gradient steps (forward, backward, SGD update) in one `tf.function`
  loop over the in-memory batches, no Keras `fit` machinery.

Keras is compiled without metrics (the strictest reference); federated
clients also compute the task's metrics.
"""

import time

from absl import logging
import numpy as np
import tensorflow as tf

from tff_partial.bench import cohorts as cohorts_lib
from tff_partial.bench import machine
from tff_partial.bench import rounds as rounds_lib
from tff_partial.training import loop

KERAS_IN_MEMORY = 'keras_in_memory'
KERAS_IN_MEMORY_AUTOTUNE = 'keras_in_memory_autotune'
KERAS_TFF_DATA_PATH = 'keras_tff_data_path'
TF_FUNCTION_FLOOR = 'tf_function_floor'
# The references run by default; every valid name.
NAMES = (KERAS_IN_MEMORY, KERAS_TFF_DATA_PATH, TF_FUNCTION_FLOOR)
ALL_NAMES = NAMES + (KERAS_IN_MEMORY_AUTOTUNE,)
# The reference every "vs limit" ratio divides by.
LIMIT = KERAS_IN_MEMORY


def round_dataset(task, cohort) -> tf.data.Dataset:
  """The cohort's preprocessed TFF client datasets, one after the other."""
  datasets = cohorts_lib.tff_client_data(task, cohort)
  merged = datasets[0]
  for d in datasets[1:]:
    merged = merged.concatenate(d)
  return merged


def in_memory(dataset: tf.data.Dataset, autotune: bool = False) -> tf.data.Dataset:
  """`dataset` cached in memory and read once, so later passes read memory;
  tf.data's autotuning off unless `autotune` (see the module docstring)."""
  cached = dataset.cache()
  for _ in cached:
    pass
  return cached if autotune else loop.autotune_off(cached)


class _Reference:
  """One centralized reference, run in the benchmark's interleaving."""

  def __init__(self, name, task, seed, learning_rate, counter):
    self.name = name
    self.task, self.counter = task, counter
    tf.keras.utils.set_random_seed(seed)
    self.model = task.keras_model_fn()
    self.optimizer = tf.keras.optimizers.SGD(learning_rate)
    if name == TF_FUNCTION_FLOOR:
      self._steps = self._make_steps()
    else:
      self.model.compile(optimizer=self.optimizer, loss=task.loss_fn())
    self.wall, self.cpu, self.examples, self.steps = [], [], [], []

  def _make_steps(self):
    model, loss_fn, optimizer = self.model, self.task.loss_fn(), self.optimizer

    @tf.function
    def steps(dataset):
      count = tf.constant(0)
      for batch in dataset:
        x, y = batch
        with tf.GradientTape() as tape:
          loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        count += 1
      return count

    return steps

  def train_round(self, round_num, cohort, timed):
    dataset = round_dataset(self.task, cohort)
    if self.name != KERAS_TFF_DATA_PATH:
      # Not timed: materialized once.
      dataset = in_memory(dataset, autotune=self.name == KERAS_IN_MEMORY_AUTOTUNE)
    c0 = machine.cpu_seconds()
    t0 = time.perf_counter()
    if self.name == TF_FUNCTION_FLOOR:
      steps = int(self._steps(dataset))
    else:
      history = self.model.fit(dataset, epochs=1, verbose=0)
      del history
      steps = None
    dt = time.perf_counter() - t0
    dc = machine.cpu_seconds() - c0
    logging.info('%s round %d: %.2fs, %.2f CPU s', self.name, round_num, dt, dc)
    if timed:
      self.wall.append(dt)
      self.cpu.append(dc)
      self.examples.append(self.counter.cohort(cohort))
      if steps is not None:
        self.steps.append(steps)

  def empty_round(self, round_num, cohort, timed):
    del round_num, cohort, timed

  def row(self) -> dict:
    wall = rounds_lib.median(self.wall)
    examples = float(np.mean(self.examples)) if self.examples else 0.0
    return {
        'name': self.name, 'algorithm': 'centralized reference',
        'rounds_timed': len(self.wall),
        'round_seconds_all': self.wall, 'round_cpu_seconds_all': self.cpu,
        'median_round_seconds': wall,
        'median_round_cpu_seconds': rounds_lib.median(self.cpu),
        'examples_per_round': examples,
        'examples_per_second': examples / wall if wall else None,
        'gradient_steps_per_round': self.steps[0] if self.steps else None,
    }


def make_references(names, task, seed: int, learning_rate: float,
                    counter: cohorts_lib.ExampleCounter) -> list:
  """The references named (a subset of `ALL_NAMES`), ready for `run_interleaved`."""
  for name in names:
    if name not in ALL_NAMES:
      raise ValueError(f'unknown reference {name!r}; valid values: {", ".join(ALL_NAMES)}')
  return [_Reference(n, task, seed, learning_rate, counter) for n in names]
