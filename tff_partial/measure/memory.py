"""Client peak memory of local training, for PVT's Table 2 comparison.

Yang et al., *Partial Variable Training for Efficient On-Device Federated
Learning* (PVT), Table 2 / Table 4: the peak memory of forward passes alone
("FProp") against that of training all variables (AVT) or a subset (PVT); the
"extra memory for training" is the difference. PVT saves it because a frozen
variable's gradient is never formed and the activations only its gradient
needs are not kept for the backward pass.

What is measured: the peak bytes held by TensorFlow's CPU allocator
(`tf.config.experimental.get_memory_info('CPU:0')['peak']`, after
`reset_memory_stats`) during one call of a compiled (`tf.function`) step on
one batch, in a fresh Python subprocess per measurement, so nothing of the
caller's process or of another measurement is counted. This counts every
tensor TensorFlow allocates on the host (model variables, the batch,
activations, gradients, optimizer temporaries), not the Python interpreter,
the TF runtime's code or its thread stacks, which RSS would mix in and which
are the same for every case. The step:

* forward: `loss(y, model(x, training=True))`;
* train: the same under a `tf.GradientTape` that watches only the trained
  variables (`trainable_mask`, default all), gradients of those variables
  only, and an SGD update of them: what a client that knows its mask runs.

TFF has no client memory measurement; this is written here.
"""

import multiprocessing
import os
import pickle
import queue as queue_lib
import time
from typing import Callable, Optional, Sequence

import numpy as np

_MODES = ('forward', 'train')


def _child(result_queue, keras_model_fn, loss_fn, input_shape, input_dtype,
           label_shape, num_classes, batch_size, trainable_mask, mode, seed):
  """Runs in the fresh subprocess: one step, reports allocator bytes."""
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  try:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.config.set_visible_devices([], 'GPU')  # host memory only
    tf.keras.utils.set_random_seed(seed)
    model = keras_model_fn()
    loss = loss_fn()
    variables = model.trainable_weights
    mask = [True] * len(variables) if trainable_mask is None else [bool(m) for m in trainable_mask]
    if len(mask) != len(variables):
      raise ValueError(
          f'trainable_mask has {len(mask)} entries; the model has '
          f'{len(variables)} trainable variables')
    trained = [v for v, m in zip(variables, mask) if m]
    rng = np.random.default_rng(seed)
    if np.issubdtype(np.dtype(input_dtype), np.integer):
      x = rng.integers(0, num_classes, size=[batch_size, *input_shape])
    else:
      x = rng.uniform(size=[batch_size, *input_shape])
    x = tf.constant(x, dtype=input_dtype)
    y = tf.constant(rng.integers(0, num_classes, size=[batch_size, *label_shape]), tf.int32)

    @tf.function
    def forward(x, y):
      return loss(y, model(x, training=True))

    @tf.function
    def train(x, y):
      with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(trained)
        value = loss(y, model(x, training=True))
      gradients = tape.gradient(value, trained)
      for variable, gradient in zip(trained, gradients):
        variable.assign_sub(0.01 * gradient)
      return value

    step = forward if mode == 'forward' else train
    step(x, y)  # trace, compile and warm up outside the measured call
    before = tf.config.experimental.get_memory_info('CPU:0')['current']
    tf.config.experimental.reset_memory_stats('CPU:0')
    step(x, y)
    peak = tf.config.experimental.get_memory_info('CPU:0')['peak']
    weights_bytes = int(sum(np.prod(v.shape) * v.dtype.size for v in model.weights))
    trained_bytes = int(sum(np.prod(v.shape) * v.dtype.size for v in trained))
    result_queue.put(dict(peak=int(peak), resident_before=int(before),
                          weights_bytes=weights_bytes,
                          trained_bytes=trained_bytes if mode == 'train' else 0))
  except Exception as e:  # pylint: disable=broad-except  (reported to parent)
    result_queue.put(dict(error=f'{type(e).__name__}: {e}'))


def measure_step_peak(
    keras_model_fn: Callable,
    loss_fn: Callable,
    input_shape: Sequence[int],
    batch_size: int,
    *,
    mode: str = 'train',
    trainable_mask: Optional[Sequence[bool]] = None,
    input_dtype: str = 'float32',
    label_shape: Sequence[int] = (),
    num_classes: int = 2,
    seed: int = 0,
    timeout_s: float = 600.0,
) -> dict:
  """Peak allocator bytes of one `mode` step, in a fresh subprocess.

  Returns dict(peak, resident_before, weights_bytes, trained_bytes).
  """
  if mode not in _MODES:
    raise ValueError(f'mode={mode!r}; valid values: {", ".join(_MODES)}')
  if batch_size <= 0:
    raise ValueError(f'batch_size={batch_size} must be a positive integer')
  args = (keras_model_fn, loss_fn, tuple(input_shape), input_dtype,
          tuple(label_shape), int(num_classes), int(batch_size),
          None if trainable_mask is None else [bool(m) for m in trainable_mask],
          mode, int(seed))
  try:
    pickle.dumps(args)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(
        'keras_model_fn and loss_fn must be picklable (module-level functions or '
        f'functools.partial of them) to run in a fresh subprocess: {e}') from e
  context = multiprocessing.get_context('spawn')
  result_queue = context.Queue()
  process = context.Process(target=_child, args=(result_queue, *args))
  process.start()
  deadline = time.monotonic() + timeout_s
  result = None
  try:
    while result is None:
      try:
        result = result_queue.get(timeout=1.0)
      except queue_lib.Empty:
        if not process.is_alive():
          try:  # it may have put its result just before exiting
            result = result_queue.get(timeout=5.0)
            break
          except queue_lib.Empty:
            pass
          raise RuntimeError(
              f'the memory measurement subprocess exited with code '
              f'{process.exitcode} without a result (killed, e.g. out of memory?)'
          ) from None
        if time.monotonic() > deadline:
          process.kill()
          raise RuntimeError(
              f'memory measurement did not finish in {timeout_s} s') from None
  finally:
    process.join(timeout=60)
  if 'error' in result:
    raise ValueError(f'memory measurement failed in the subprocess: {result["error"]}')
  return result


def client_training_peak(
    keras_model_fn: Callable,
    loss_fn: Callable,
    input_shape: Sequence[int],
    batch_size: int,
    trainable_mask: Optional[Sequence[bool]] = None,
    **kwargs,
) -> dict:
  """Forward-only and training peak bytes of one client step, and their gap.

  Args:
    keras_model_fn: picklable no-arg callable returning a Keras model.
    loss_fn: picklable no-arg callable returning a Keras loss taking
      (labels int32, model output).
    input_shape: shape of one example (without the batch dimension).
    batch_size: examples per step.
    trainable_mask: one bool per `model.trainable_weights` (PVT's mask); None
      trains all variables (AVT).
    **kwargs: `input_dtype`, `label_shape`, `num_classes`, `seed`,
      `timeout_s` of `measure_step_peak`.

  Returns:
    dict(forward_peak, train_peak, extra = train_peak - forward_peak,
    weights_bytes, trained_bytes), all in bytes.
  """
  forward = measure_step_peak(keras_model_fn, loss_fn, input_shape, batch_size,
                              mode='forward', **kwargs)
  train = measure_step_peak(keras_model_fn, loss_fn, input_shape, batch_size,
                            mode='train', trainable_mask=trainable_mask, **kwargs)
  return dict(
      forward_peak=forward['peak'],
      train_peak=train['peak'],
      extra=train['peak'] - forward['peak'],
      weights_bytes=train['weights_bytes'],
      trained_bytes=train['trained_bytes'],
  )
