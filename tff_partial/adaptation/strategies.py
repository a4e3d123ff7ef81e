"""Local adaptation strategies for a trained federated model (Yu et al. 2020).

Yu, Bagdasaryan, Shmatikov, "Salvaging Federated Learning by Local Adaptation"
(arXiv:2002.04758), section 6. Starting from the federated weights theta*, a
participant trains on its own data with one of:

* `finetune` (FT): all trainable variables, cross-entropy loss.
* `freeze_base` (FB): only the variables of the top layer (the last Keras
  layer that has weights); every other variable keeps theta*.
* `ewc` (MTL with elastic weight consolidation, Kirkpatrick et al. 2017):
  cross-entropy + lambda/2 * sum_i F_i (theta_i - theta*_i)^2, with F the
  diagonal Fisher information of the federated model (see `fisher.py`).
  We minimise it by proximal gradient descent: the optimizer's step on the
  cross-entropy, then the exact proximal step of the quadratic penalty,
  theta <- (theta + lr*lambda*F*theta*) / (1 + lr*lambda*F). Same objective
  and fixed points as a gradient step on the whole loss, but stable for every
  lambda (a plain gradient step on the penalty diverges once
  lr*lambda*F_i > 2, which large lambdas reach); hand-written because Keras
  optimizers have no proximal steps.
* `distill` (KD, Hinton et al. 2015): teacher = the federated model (fixed),
  student initialised from it;
  loss = alpha * T^2 * KL(softmax(t/T) || softmax(s/T)) + (1 - alpha) * CE.
* `local` (the baseline, not an adaptation): the same model trained from a
  fresh seeded Keras initialisation on the participant's data alone.

Everything here is plain Keras/TF on one participant at a time (no TFF
computation): the caller loops over participants. See `evaluation.py` for why
TFF's `build_personalization_eval_computation` is not used.

All strategies share one loop: for each epoch a seeded permutation of the
participant's examples (the same for every strategy given the same seed), in
batches, one SGD step (Keras `SGD`, optional momentum) per batch. A
`LocalTrainer` keeps one student and one teacher Keras model and one traced
train step per strategy, reused across participants (re-tracing a step per
participant would cost more than training on FEMNIST-sized clients).
"""

import dataclasses
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

FINETUNE = 'finetune'
FREEZE_BASE = 'freeze_base'
EWC = 'ewc'
DISTILL = 'distill'
LOCAL = 'local'
ADAPTATION_STRATEGIES = (FINETUNE, FREEZE_BASE, EWC, DISTILL)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """How one participant trains locally (used for `local` and for adaptation)."""

  epochs: int = 5
  learning_rate: float = 0.05
  batch_size: int = 20
  momentum: float = 0.0

  def validate(self, name: str = 'train config') -> None:
    if self.epochs < 0:
      raise ValueError(f'{name}: epochs={self.epochs} must be >= 0')
    if self.learning_rate <= 0:
      raise ValueError(f'{name}: learning_rate={self.learning_rate} must be > 0')
    if self.batch_size <= 0:
      raise ValueError(f'{name}: batch_size={self.batch_size} must be > 0')
    if not 0.0 <= self.momentum < 1.0:
      raise ValueError(f'{name}: momentum={self.momentum} must be in [0, 1)')


@dataclasses.dataclass(frozen=True)
class StrategyConfig:
  """Hyperparameters of EWC and KD."""

  ewc_lambda: float = 1000.0
  kd_alpha: float = 0.5
  kd_temperature: float = 2.0

  def validate(self) -> None:
    if self.ewc_lambda < 0:
      raise ValueError(f'ewc_lambda={self.ewc_lambda} must be >= 0')
    if not 0.0 <= self.kd_alpha <= 1.0:
      raise ValueError(f'kd_alpha={self.kd_alpha} must be in [0, 1]')
    if self.kd_temperature <= 0:
      raise ValueError(f'kd_temperature={self.kd_temperature} must be > 0')


def top_layer(model: tf.keras.Model) -> tf.keras.layers.Layer:
  """The last layer that owns trainable weights (freeze-base trains only it)."""
  for layer in reversed(model.layers):
    if layer.trainable_weights:
      return layer
  raise ValueError(f'model {model.name!r} has no layer with trainable weights')


def epoch_batches(num_examples: int, batch_size: int, seed: int, epoch: int):
  """Index arrays of one epoch: a permutation seeded by (seed, epoch)."""
  order = np.random.default_rng([seed, epoch]).permutation(num_examples)
  return [order[i:i + batch_size] for i in range(0, num_examples, batch_size)]


def distillation_loss(teacher_logits, student_logits, labels, loss_fn,
                      alpha: float, temperature: float):
  """alpha*T^2*KL(softmax(t/T) || softmax(s/T)) + (1-alpha)*CE(labels, s).

  The KL divergence is summed over the class axis and averaged over all other
  axes (examples, and sequence positions for next-token models).
  """
  t = tf.nn.log_softmax(teacher_logits / temperature, axis=-1)
  s = tf.nn.log_softmax(student_logits / temperature, axis=-1)
  kl = tf.reduce_mean(tf.reduce_sum(tf.exp(t) * (t - s), axis=-1))
  ce = loss_fn(labels, student_logits)
  return alpha * temperature**2 * kl + (1.0 - alpha) * ce


class LocalTrainer:
  """Trains one participant at a time with any strategy; reusable.

  Args:
    keras_model_fn: no-arg callable returning a new uncompiled Keras model
      whose outputs are logits.
    loss_fn: no-arg callable returning the Keras cross-entropy loss.
    strategy_config: EWC/KD hyperparameters.
  """

  def __init__(self, keras_model_fn: Callable[[], tf.keras.Model],
               loss_fn: Callable[[], tf.keras.losses.Loss],
               strategy_config: StrategyConfig = StrategyConfig()):
    strategy_config.validate()
    self._keras_model_fn = keras_model_fn
    self._config = strategy_config
    self.model = keras_model_fn()
    self._loss = loss_fn()
    self._teacher = None
    # EWC anchor (theta*) and diagonal Fisher, one per trainable variable.
    self._anchor = [tf.Variable(tf.zeros_like(v), trainable=False)
                    for v in self.model.trainable_variables]
    self._fisher = [tf.Variable(tf.zeros_like(v), trainable=False)
                    for v in self.model.trainable_variables]
    self._steps = {}  # (strategy, momentum) -> (traced step, its optimizer)

  @property
  def teacher(self) -> tf.keras.Model:
    if self._teacher is None:
      self._teacher = self._keras_model_fn()
    return self._teacher

  def variables_to_train(self, strategy: str) -> list:
    if strategy == FREEZE_BASE:
      return list(top_layer(self.model).trainable_variables)
    return list(self.model.trainable_variables)

  def _strategy_loss(self, strategy, x, y, logits):
    if strategy in (FINETUNE, FREEZE_BASE, LOCAL):
      return self._loss(y, logits)
    if strategy == EWC:
      # The penalty is applied by its proximal step in `_step` (see there).
      return self._loss(y, logits)
    if strategy == DISTILL:
      teacher_logits = tf.stop_gradient(self.teacher(x, training=False))
      return distillation_loss(teacher_logits, logits, y, self._loss,
                               self._config.kd_alpha, self._config.kd_temperature)
    raise ValueError(f'unknown strategy {strategy!r}; valid values: '
                     + ', '.join((LOCAL,) + ADAPTATION_STRATEGIES))

  def _step(self, strategy: str, momentum: float):
    key = (strategy, momentum)
    if key not in self._steps:
      variables = self.variables_to_train(strategy)
      optimizer = tf.keras.optimizers.SGD(learning_rate=0.1, momentum=momentum)
      optimizer.build(variables)

      @tf.function(reduce_retracing=True)
      def step(x, y):
        with tf.GradientTape() as tape:
          logits = self.model(x, training=True)
          loss = self._strategy_loss(strategy, x, y, logits)
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        if strategy == EWC:
          # Proximal step of lambda/2 * sum F (v - anchor)^2 with step size
          # lr: v <- argmin_u |u - v|^2 / (2 lr) + lambda/2 F (u - anchor)^2.
          c = tf.cast(optimizer.learning_rate, tf.float32) * self._config.ewc_lambda
          for v, a, f in zip(variables, self._anchor, self._fisher):
            v.assign((v + c * f * a) / (1.0 + c * f))
        return loss

      self._steps[key] = (step, optimizer)
    return self._steps[key]

  def set_fisher(self, fisher: Sequence[np.ndarray]) -> None:
    """Diagonal Fisher, one array per trainable variable (for `ewc`)."""
    if len(fisher) != len(self._fisher):
      raise ValueError(f'fisher has {len(fisher)} arrays; the model has '
                       f'{len(self._fisher)} trainable variables')
    for var, value in zip(self._fisher, fisher):
      var.assign(value)

  def train(self, strategy: str, initial_weights: Sequence[np.ndarray],
            x: np.ndarray, y: np.ndarray, config: TrainConfig, seed: int,
            fisher: Optional[Sequence[np.ndarray]] = None) -> list:
    """Trains from `initial_weights` with `strategy`; returns the new weights.

    `initial_weights` is a Keras `get_weights()` list: the federated model for
    the adaptation strategies (also the EWC anchor and the KD teacher), a
    fresh initialisation for `local`. `ewc` needs `fisher` (or a previous
    `set_fisher`).
    """
    config.validate(strategy)
    self.model.set_weights(initial_weights)
    if strategy == EWC:
      for var, value in zip(self._anchor, self.model.trainable_variables):
        var.assign(value)
      if fisher is not None:
        self.set_fisher(fisher)
    if strategy == DISTILL:
      self.teacher.set_weights(initial_weights)
    step, optimizer = self._step(strategy, config.momentum)
    # Fresh optimizer state (iterations, momentum) for each participant.
    for var in optimizer.variables:
      var.assign(tf.zeros_like(var))
    optimizer.learning_rate.assign(config.learning_rate)
    n = len(y)
    for epoch in range(config.epochs):
      for idx in epoch_batches(n, config.batch_size, seed, epoch):
        step(tf.constant(x[idx]), tf.constant(y[idx]))
    return self.model.get_weights()

  def fresh_weights(self, seed: int) -> list:
    """A seeded Keras initialisation of the model (the `local` start)."""
    tf.keras.utils.set_random_seed(seed)
    return self._keras_model_fn().get_weights()
