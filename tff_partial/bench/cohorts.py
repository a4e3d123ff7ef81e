"""Who trains in a benchmark round, and the client values each path builds.

Every configuration of a benchmark trains the same sampled clients per round
(the training loop's seeded sampler). Two client data paths are measured:

* TFF's own: `create_tf_dataset_for_client` + the baseline task's
  preprocessing (what a user of `tff.simulation.baselines` writes);
* this package's: the training loop's per-round path
  (`loop.build_client_selection_fn`: seeded shuffle per (seed, round,
  client), preprocessing, the method's `client_input_fn`).
"""

from typing import Callable, Sequence

import tensorflow as tf
import tensorflow_federated as tff

from tff_partial.training import loop
from tff_partial.training import method as method_lib


def sample_cohort(client_ids: Sequence[str], seed: int, round_num: int,
                  size: int) -> list[str]:
  """Clients of a round, as the training loop samples them.

  A cohort larger than the population (scaling sweeps) samples with replacement.
  """
  sample = tff.simulation.build_uniform_sampling_fn(
      list(client_ids), replace=size > len(client_ids), random_seed=seed)
  return list(sample(round_num, size))


def sample_cohorts(client_ids, seed: int, rounds: int, size: int) -> list[list[str]]:
  return [sample_cohort(client_ids, seed, r, size) for r in range(rounds)]


def tff_client_data(task, cohort: Sequence[str]) -> list[tf.data.Dataset]:
  """TFF's own path: the baseline task's preprocessing of each client."""
  data = task.baseline.datasets
  return [data.train_preprocess_fn(data.train_data.create_tf_dataset_for_client(c))
          for c in cohort]


# (cohort, round_num, empty) -> the client values `process.next` takes.
InputsFn = Callable[[Sequence[str], int, bool], list]


def tff_inputs_fn(task) -> InputsFn:
  def inputs(cohort, round_num, empty=False):
    del round_num
    values = tff_client_data(task, cohort)
    return [v.take(0) for v in values] if empty else values
  return inputs


def package_inputs_fn(task, built: method_lib.BuiltMethod, seed: int) -> InputsFn:
  """The training loop's per-round client values for `built`.

  When the cohort is the loop's own sample, the loop's
  `build_client_selection_fn` makes them; otherwise (empty datasets, cohorts
  sampled with replacement) the same steps run on `cohort`.
  """
  selection_fns = {}

  def inputs(cohort, round_num, empty=False):
    if not empty and len(cohort) <= task.population:
      if len(cohort) not in selection_fns:
        selection_fns[len(cohort)] = loop.build_client_selection_fn(
            task, built, len(cohort), seed)
      return selection_fns[len(cohort)](round_num)
    return [loop.client_value(task, built, seed, round_num, index, client_id, empty=empty)
            for index, client_id in enumerate(cohort)]

  return inputs


class ExampleCounter:
  """Examples one client trains on per round (epochs and max batches applied)."""

  def __init__(self, task):
    self._task = task
    self._counts = {}

  def __call__(self, client_id: str) -> int:
    if client_id not in self._counts:
      (dataset,) = tff_client_data(self._task, [client_id])
      total = 0
      for batch in dataset:
        total += int(tf.shape(tf.nest.flatten(batch)[0])[0])
      self._counts[client_id] = total
    return self._counts[client_id]

  def cohort(self, cohort: Sequence[str]) -> int:
    return sum(self(c) for c in cohort)
