"""Diagonal Fisher information of the federated model, for EWC.

Yu et al. 2020 (section 6, multi-task learning) weight the EWC penalty by the
Fisher information of the federated model theta* (Kirkpatrick et al. 2017).
We estimate its diagonal as the *empirical Fisher*:

    F_i = 1/N sum_n (d/d theta_i  log p(y_n | x_n; theta*))^2,

from per-example gradients (`batch_size=1`, the default) of the task's
cross-entropy (= -log-likelihood; for next-token models the per-example value
is the mean over the sequence's positions) on the **participant's own
training data** -- the only data a participant has; the federated data never
leaves the other participants. At most `max_examples` examples are used (the
first ones, in order). `batch_size > 1` squares per-batch mean gradients
instead: cheaper, and smaller (it averages gradients before squaring).
"""

from typing import Optional

import numpy as np
import tensorflow as tf


class EmpiricalFisher:
  """Diagonal empirical Fisher of a Keras model at its current weights.

  Traces its gradient step once; reuse it across participants (set the
  model's weights, call again).
  """

  def __init__(self, model: tf.keras.Model, loss: tf.keras.losses.Loss):
    self._model = model
    self._loss = loss
    self._variables = model.trainable_variables
    self._sums = [tf.Variable(tf.zeros_like(v), trainable=False)
                  for v in self._variables]

    @tf.function(reduce_retracing=True)
    def accumulate(xb, yb):
      with tf.GradientTape() as tape:
        value = self._loss(yb, self._model(xb, training=False))
      for total, grad in zip(self._sums, tape.gradient(value, self._variables)):
        if grad is not None:
          total.assign_add(tf.square(grad))

    self._accumulate = accumulate

  def __call__(self, x: np.ndarray, y: np.ndarray, *, batch_size: int = 1,
               max_examples: Optional[int] = None) -> list:
    """One float32 array per `model.trainable_variables`, same shapes."""
    if batch_size <= 0:
      raise ValueError(f'fisher batch_size={batch_size} must be > 0')
    n = len(y) if max_examples is None else min(len(y), max_examples)
    if n == 0:
      raise ValueError('the empirical Fisher needs at least one example')
    for total in self._sums:
      total.assign(tf.zeros_like(total))
    num_batches = 0
    for start in range(0, n, batch_size):
      end = min(n, start + batch_size)
      self._accumulate(tf.constant(x[start:end]), tf.constant(y[start:end]))
      num_batches += 1
    return [total.numpy() / num_batches for total in self._sums]


def empirical_fisher(model: tf.keras.Model, loss: tf.keras.losses.Loss,
                     x: np.ndarray, y: np.ndarray, *, batch_size: int = 1,
                     max_examples: Optional[int] = None) -> list:
  """One-off `EmpiricalFisher(model, loss)(x, y, ...)`."""
  return EmpiricalFisher(model, loss)(
      x, y, batch_size=batch_size, max_examples=max_examples)
