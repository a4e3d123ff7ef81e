"""Helpers for task tests: TFF FedAvg rounds on a task, and parameter counts."""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


def build_fedavg(task, client_lr=0.1, server_lr=1.0):
  return tff.learning.algorithms.build_weighted_fed_avg(
      task.baseline.model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=client_lr),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=server_lr),
  )


def client_datasets(task, client_ids, seed=None):
  """Preprocessed training datasets; shuffled per client when `seed` is set."""
  out = []
  for i, cid in enumerate(client_ids):
    raw = task.train_data.create_tf_dataset_for_client(cid)
    if seed is not None:
      raw = raw.shuffle(10_000, seed=seed * 1_000 + i)
    out.append(task.baseline.datasets.train_preprocess_fn(raw))
  return out


def run_fedavg(task, num_rounds, clients_per_round, seed=0, client_lr=0.1,
               server_lr=1.0, process=None):
  """Runs FedAvg rounds on clients sampled with `seed`; returns (process, state, metrics)."""
  process = process or build_fedavg(task, client_lr, server_lr)
  state = process.initialize()
  rng = np.random.default_rng(seed)
  ids = task.train_data.client_ids
  history = []
  for round_num in range(num_rounds):
    sampled = [ids[i] for i in rng.choice(len(ids), clients_per_round, replace=False)]
    result = process.next(state, client_datasets(task, sampled, seed=round_num))
    state = result.state
    history.append(result.metrics['client_work']['train'])
  return process, state, history


def param_count(model: tf.keras.Model) -> int:
  return int(sum(np.prod(v.shape) for v in model.weights))
