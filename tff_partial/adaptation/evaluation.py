"""Per-participant evaluation of local adaptation (Yu et al. 2020, sec. 5-7).

For one participant (a client of a federated task) this measures, on the
participant's own held-out data:

* `federated`: the federated model as trained (no adaptation);
* `local`: a model trained from scratch on the participant's data alone;
* one accuracy per adaptation strategy (`finetune`, `freeze_base`, `ewc`,
  `distill`, see `strategies.py`), each started from the federated model.

Held-out data: the participant's test split when the task has one for that
client (FEMNIST/LEAF and Shakespeare: every train client is a test client),
else the last `test_fraction` of its examples in their stored order (the
paper's chronological split of Reddit posts).

Why not `tff.learning.algorithms.build_personalization_eval_computation`:
it hands each strategy a `tff.learning` `VariableModel` whose only state is
the broadcast weights, inside one TFF computation. EWC needs a second set of
variables (anchor and Fisher) and KD a second model (the teacher), both
created per strategy inside the traced computation, and the from-scratch
baseline needs the Keras initialisers rather than the broadcast weights. It is
also traced and serialised per strategy, which on the 2-core machines we run
on costs more than the training itself. So the loop over participants is plain
Python over Keras models here: one participant at a time, one traced step per
strategy reused for all participants (`strategies.LocalTrainer`).
"""

import collections
import dataclasses
import math
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_partial.adaptation import fisher as fisher_lib
from tff_partial.adaptation import strategies

FEDERATED = 'federated'
SPLITS = ('auto', 'test_split', 'in_order')


@dataclasses.dataclass(frozen=True)
class ParticipantData:
  """One participant's preprocessed examples (unbatched numpy arrays)."""

  client_id: str
  train_x: np.ndarray
  train_y: np.ndarray
  test_x: np.ndarray
  test_y: np.ndarray
  split: str  # 'test_split' or 'in_order'


def _to_arrays(dataset: tf.data.Dataset):
  xs, ys = [], []
  for element in dataset:
    if isinstance(element, collections.abc.Mapping):
      x, y = element['x'], element['y']
    else:
      x, y = element
    xs.append(x.numpy())
    ys.append(y.numpy())
  if not xs:
    return None, None
  return np.concatenate(xs), np.concatenate(ys)


def participant_data(task, client_id: str, *, split: str = 'auto',
                     test_fraction: float = 0.2) -> ParticipantData:
  """Train/held-out arrays of `client_id`, preprocessed as for evaluation.

  split: `test_split` (the task's test data of this client), `in_order` (the
  last `test_fraction` of its training examples, in stored order) or `auto`
  (test split when the task has separate test data for this client).
  """
  if split not in SPLITS:
    raise ValueError(f'split={split!r}; valid values: {", ".join(SPLITS)}')
  if not 0.0 < test_fraction < 1.0:
    raise ValueError(f'test_fraction={test_fraction} must be in (0, 1)')
  preprocess = task.baseline.datasets.eval_preprocess_fn  # 1 epoch, in order
  x, y = _to_arrays(preprocess(task.train_data.create_tf_dataset_for_client(client_id)))
  if x is None:
    raise ValueError(f'participant {client_id!r} has no training examples')
  test = task.test_data
  has_own_test = (
      isinstance(test, tff.simulation.datasets.ClientData)
      and test is not task.train_data
      and client_id in set(test.client_ids))
  if split == 'test_split' and not has_own_test:
    raise ValueError(f'split=test_split: participant {client_id!r} has no '
                     'separate test data in this task; use split=in_order')
  if split in ('auto', 'test_split') and has_own_test:
    tx, ty = _to_arrays(preprocess(test.create_tf_dataset_for_client(client_id)))
    if tx is not None:
      return ParticipantData(client_id, x, y, tx, ty, 'test_split')
    if split == 'test_split':
      raise ValueError(f'participant {client_id!r} has an empty test split')
  if len(y) < 2:
    raise ValueError(f'participant {client_id!r} has {len(y)} example(s): '
                     'too few to split in order')
  num_test = min(len(y) - 1, max(1, math.ceil(test_fraction * len(y))))
  cut = len(y) - num_test
  return ParticipantData(client_id, x[:cut], y[:cut], x[cut:], y[cut:], 'in_order')


class ParticipantEvaluator:
  """Runs the local baseline and the adaptation strategies per participant.

  Args:
    task: a `tasks.registry.Task` (its Keras model, loss and metrics are used).
    federated_weights: the federated model as a Keras `get_weights()` list.
    local_config: training of the from-scratch local model.
    adapt_config: training of every adaptation strategy.
    strategy_config: EWC lambda, KD alpha and temperature.
    strategy_names: which adaptation strategies to run.
    fisher_batch_size, fisher_max_examples: see `fisher.py`.
    seed: seeds the local model's initialisation and the batch order.
  """

  def __init__(self, task, federated_weights: Sequence[np.ndarray], *,
               local_config: strategies.TrainConfig,
               adapt_config: strategies.TrainConfig,
               strategy_config: strategies.StrategyConfig = strategies.StrategyConfig(),
               strategy_names: Sequence[str] = strategies.ADAPTATION_STRATEGIES,
               fisher_batch_size: int = 1,
               fisher_max_examples: Optional[int] = 500,
               seed: int = 0):
    unknown = [s for s in strategy_names if s not in strategies.ADAPTATION_STRATEGIES]
    if unknown:
      raise ValueError(f'unknown strategies {unknown}; valid values: '
                       + ', '.join(strategies.ADAPTATION_STRATEGIES))
    local_config.validate('local')
    adapt_config.validate('adapt')
    self._task = task
    self._local_config = local_config
    self._adapt_config = adapt_config
    self._strategy_names = tuple(strategy_names)
    self._fisher_batch_size = fisher_batch_size
    self._fisher_max_examples = fisher_max_examples
    self._seed = seed
    self.trainer = strategies.LocalTrainer(
        task.keras_model_fn, task.loss_fn, strategy_config)
    model = self.trainer.model
    expected = [tuple(w.shape) for w in model.get_weights()]
    got = [tuple(np.shape(w)) for w in federated_weights]
    if expected != got:
      raise ValueError(
          f'federated weights do not fit task {task.name!r}: shapes {got} vs '
          f'the model\'s {expected}')
    self._federated = [np.asarray(w) for w in federated_weights]
    self._fisher = fisher_lib.EmpiricalFisher(model, task.loss_fn())
    self._metrics = task.metrics_fn()
    self._predict = tf.function(lambda x: model(x, training=False),
                                reduce_retracing=True)

  @property
  def columns(self) -> tuple:
    return ('participant', 'split', 'num_train', 'num_test', FEDERATED,
            strategies.LOCAL) + self._strategy_names

  def accuracy(self, weights, x: np.ndarray, y: np.ndarray,
               batch_size: int = 256) -> float:
    """The task's accuracy metric of `weights` on (x, y)."""
    self.trainer.model.set_weights(weights)
    metric = next((m for m in self._metrics if 'accuracy' in m.name),
                  self._metrics[0])
    metric.reset_state()
    for start in range(0, len(y), batch_size):
      logits = self._predict(tf.constant(x[start:start + batch_size]))
      metric.update_state(y[start:start + batch_size], logits)
    return float(metric.result().numpy())

  def evaluate(self, data: ParticipantData, participant_index: int = 0,
               local_accuracy: Optional[float] = None) -> dict:
    """One row: accuracies on the participant's held-out data.

    `participant_index` seeds the local model's initialisation and the batch
    order; `local_accuracy`, when given (from an earlier run with the same
    local settings), skips training the local model.
    """
    seed = self._seed * 1_000_003 + participant_index
    row = collections.OrderedDict(
        participant=data.client_id, split=data.split,
        num_train=len(data.train_y), num_test=len(data.test_y))
    row[FEDERATED] = self.accuracy(self._federated, data.test_x, data.test_y)
    if local_accuracy is None:
      local = self.trainer.train(
          strategies.LOCAL, self.trainer.fresh_weights(seed), data.train_x,
          data.train_y, self._local_config, seed)
      local_accuracy = self.accuracy(local, data.test_x, data.test_y)
    row[strategies.LOCAL] = float(local_accuracy)
    fisher = None
    if strategies.EWC in self._strategy_names:
      self.trainer.model.set_weights(self._federated)
      fisher = self._fisher(data.train_x, data.train_y,
                            batch_size=self._fisher_batch_size,
                            max_examples=self._fisher_max_examples)
    for name in self._strategy_names:
      adapted = self.trainer.train(
          name, self._federated, data.train_x, data.train_y,
          self._adapt_config, seed, fisher=fisher if name == strategies.EWC else None)
      row[name] = self.accuracy(adapted, data.test_x, data.test_y)
    return row
