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

Class-ratio accuracy (`metric=class_ratio_accuracy`, sec. 4.2): "CIFAR-10 is
not divided into distinct participants with their own training and test sets.
To measure the test accuracy of a model on a participant's distribution, we
calculate its per-class accuracy on the CIFAR-10 global test dataset,
multiply it by the corresponding class's ratio in the participant's training
dataset, and sum up the resulting values." With it a participant trains (its
local model, every adaptation) on all of its examples (`split=global_test`),
and every model is judged on the task's centralized test set
(`global_test_data`) by `class_ratio_accuracy(per_class_accuracy(...),
class_ratios(participant labels))`.

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
ACCURACY = 'accuracy'
CLASS_RATIO_ACCURACY = 'class_ratio_accuracy'
METRICS = (ACCURACY, CLASS_RATIO_ACCURACY)
# The split of class-ratio accuracy: all of a participant's examples train, the
# task's global test set judges.
GLOBAL_TEST = 'global_test'


@dataclasses.dataclass(frozen=True)
class ParticipantData:
  """One participant's preprocessed examples (unbatched numpy arrays)."""

  client_id: str
  train_x: np.ndarray
  train_y: np.ndarray
  test_x: Optional[np.ndarray]  # None with split 'global_test'
  test_y: Optional[np.ndarray]
  split: str  # 'test_split', 'in_order' or 'global_test'


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
  last `test_fraction` of its training examples, in stored order), `auto`
  (test split when the task has separate test data for this client), or
  `global_test` (all examples train; no held-out data of its own: the
  class-ratio metric judges on the task's global test set).
  """
  if split not in SPLITS + (GLOBAL_TEST,):
    raise ValueError(f'split={split!r}; valid values: '
                     + ', '.join(SPLITS + (GLOBAL_TEST,)))
  if not 0.0 < test_fraction < 1.0:
    raise ValueError(f'test_fraction={test_fraction} must be in (0, 1)')
  preprocess = task.baseline.datasets.eval_preprocess_fn  # 1 epoch, in order
  x, y = _to_arrays(preprocess(task.train_data.create_tf_dataset_for_client(client_id)))
  if x is None:
    raise ValueError(f'participant {client_id!r} has no training examples')
  if split == GLOBAL_TEST:
    return ParticipantData(client_id, x, y, None, None, GLOBAL_TEST)
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


def class_ratios(labels: np.ndarray, num_classes: int) -> np.ndarray:
  """float64[num_classes]: the share of each class among `labels`."""
  labels = np.asarray(labels).reshape(-1).astype(np.int64)
  if not len(labels):
    raise ValueError('no labels to take class ratios of')
  return np.bincount(labels, minlength=num_classes)[:num_classes] / len(labels)


def per_class_accuracy(predicted: np.ndarray, labels: np.ndarray,
                       num_classes: int) -> np.ndarray:
  """float64[num_classes]: accuracy on each class's examples (nan: none)."""
  predicted = np.asarray(predicted).reshape(-1)
  labels = np.asarray(labels).reshape(-1).astype(np.int64)
  total = np.bincount(labels, minlength=num_classes)[:num_classes]
  correct = np.bincount(labels[predicted == labels], minlength=num_classes)[:num_classes]
  with np.errstate(invalid='ignore', divide='ignore'):
    return np.where(total > 0, correct / np.maximum(total, 1), np.nan)


def class_ratio_accuracy(class_accuracy: np.ndarray, ratios: np.ndarray) -> float:
  """sum_c ratio_c * accuracy_c (Yu et al. 2020, sec. 4.2).

  A class the participant has (ratio > 0) must have test examples.
  """
  class_accuracy = np.asarray(class_accuracy, np.float64)
  ratios = np.asarray(ratios, np.float64)
  missing = np.flatnonzero((ratios > 0) & np.isnan(class_accuracy))
  if missing.size:
    raise ValueError(f'classes {missing.tolist()} of the participant have no '
                     'test examples to measure accuracy on')
  return float(np.sum(ratios[ratios > 0] * class_accuracy[ratios > 0]))


def global_test_data(task, max_per_class: Optional[int] = None):
  """(x, y): the task's centralized test set, preprocessed for evaluation.

  `max_per_class`: keep the first that many examples of each class (in stored
  order), to bound evaluation time; None keeps all.
  """
  x, y = _to_arrays(task.centralized_test_dataset())
  if x is None:
    raise ValueError(f'task {task.name!r} has no test examples')
  if max_per_class is not None:
    if max_per_class < 1:
      raise ValueError(f'max_per_class={max_per_class} must be positive (or None: all)')
    flat = y.reshape(-1)
    keep = np.concatenate([np.flatnonzero(flat == c)[:max_per_class]
                           for c in np.unique(flat)])
    keep.sort()
    x, y = x[keep], y[keep]
  return x, y


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
    metric: `accuracy` (the task's accuracy metric on each participant's
      held-out data) or `class_ratio_accuracy` (per-class accuracy on
      `global_test` weighted by the participant's training class ratios;
      participants then come with `split=global_test`).
    global_test: (x, y) arrays of the global test set, for
      `class_ratio_accuracy` (see `global_test_data`).
  """

  def __init__(self, task, federated_weights: Sequence[np.ndarray], *,
               local_config: strategies.TrainConfig,
               adapt_config: strategies.TrainConfig,
               strategy_config: strategies.StrategyConfig = strategies.StrategyConfig(),
               strategy_names: Sequence[str] = strategies.ADAPTATION_STRATEGIES,
               fisher_batch_size: int = 1,
               fisher_max_examples: Optional[int] = 500,
               seed: int = 0,
               metric: str = ACCURACY,
               global_test: Optional[tuple] = None):
    if metric not in METRICS:
      raise ValueError(f'metric={metric!r}; valid values: {", ".join(METRICS)}')
    if (metric == CLASS_RATIO_ACCURACY) != (global_test is not None):
      raise ValueError('global_test (x, y) is needed exactly with '
                       f'metric={CLASS_RATIO_ACCURACY}')
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
    self.metric = metric
    self._global_test = global_test
    self._num_classes = int(model.output_shape[-1])
    self._federated_class_accuracy = None  # computed once, on first use

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

  def class_accuracy(self, weights, batch_size: int = 256) -> np.ndarray:
    """Per-class accuracy of `weights` on the global test set."""
    x, y = self._global_test
    self.trainer.model.set_weights(weights)
    predicted = np.concatenate([
        np.argmax(self._predict(tf.constant(x[start:start + batch_size])), axis=-1)
        for start in range(0, len(y), batch_size)])
    return per_class_accuracy(predicted, y, self._num_classes)

  def score(self, weights, data: ParticipantData) -> float:
    """The chosen metric of `weights` for this participant."""
    if self.metric == ACCURACY:
      return self.accuracy(weights, data.test_x, data.test_y)
    if weights is self._federated:
      if self._federated_class_accuracy is None:
        self._federated_class_accuracy = self.class_accuracy(self._federated)
      class_accuracy = self._federated_class_accuracy
    else:
      class_accuracy = self.class_accuracy(weights)
    return class_ratio_accuracy(
        class_accuracy, class_ratios(data.train_y, self._num_classes))

  def evaluate(self, data: ParticipantData, participant_index: int = 0,
               local_accuracy: Optional[float] = None) -> dict:
    """One row: accuracies on the participant's held-out data.

    `participant_index` seeds the local model's initialisation and the batch
    order; `local_accuracy`, when given (from an earlier run with the same
    local settings), skips training the local model.
    """
    seed = self._seed * 1_000_003 + participant_index
    if (data.split == GLOBAL_TEST) != (self.metric == CLASS_RATIO_ACCURACY):
      raise ValueError(f'participant data of split {data.split!r} do not fit '
                       f'metric {self.metric!r} (class-ratio accuracy goes with '
                       f'split {GLOBAL_TEST!r})')
    num_test = len(data.test_y) if data.test_y is not None else len(self._global_test[1])
    row = collections.OrderedDict(
        participant=data.client_id, split=data.split,
        num_train=len(data.train_y), num_test=num_test)
    row[FEDERATED] = self.score(self._federated, data)
    if local_accuracy is None:
      local = self.trainer.train(
          strategies.LOCAL, self.trainer.fresh_weights(seed), data.train_x,
          data.train_y, self._local_config, seed)
      local_accuracy = self.score(local, data)
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
      row[name] = self.score(adapted, data)
    return row
