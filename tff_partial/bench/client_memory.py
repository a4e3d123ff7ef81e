"""The benchmark's client memory column, via `tff_partial.measure.memory`."""

import numpy as np
import tensorflow as tf

from tff_partial.measure import memory


class ClientMemory:
  """Client extra training memory (PVT's Table 2), via `tff_partial.measure.memory`.

  For a configuration, each of the first `num_clients` clients of the first
  round trains the variables `BuiltMethod.client_trained_mask_fn` names (all
  of them when it is None); its extra memory is the TensorFlow allocator peak
  of one training step on one batch that differentiates only those variables,
  minus the peak of a forward-only step, each in a fresh subprocess. Peaks are
  cached per mask, so configurations that train the same variables (TFF
  FedAvg, FedAvg) share one measurement.
  """

  def __init__(self, task, batch_size: int, seed: int, num_clients: int):
    self.task, self.batch_size, self.seed = task, batch_size, seed
    self.num_clients = num_clients
    x_spec, y_spec = task.baseline.datasets.element_type_structure
    self.kwargs = dict(
        input_dtype=x_spec.dtype.name, label_shape=tuple(y_spec.shape[1:]),
        num_classes=self._num_classes(), seed=seed)
    self.input_shape = tuple(x_spec.shape[1:])
    self._forward = None
    self._train = {}

  def _num_classes(self) -> int:
    with tf.Graph().as_default():  # a throwaway model
      return int(self.task.keras_model_fn().output_shape[-1])

  def _peak(self, mode, mask=None) -> int:
    return memory.measure_step_peak(
        self.task.keras_model_fn, self.task.loss_fn, self.input_shape,
        self.batch_size, mode=mode, trainable_mask=mask, **self.kwargs)['peak']

  def measure(self, built) -> dict:
    """{client_extra_memory_bytes (mean), ..._max, memory_note}."""
    if not built.client_model_is_task_model:
      return {'memory_note': 'not measured: a client trains a sliced sub-model, '
                             'not the task model'}
    if built.client_trained_mask_fn is None:
      masks = [None]
    else:
      masks = [tuple(built.client_trained_mask_fn(0, i)) for i in range(self.num_clients)]
    try:
      if self._forward is None:
        self._forward = self._peak('forward')
      extras = []
      for mask in masks:
        if mask not in self._train:
          self._train[mask] = self._peak('train', mask)
        extras.append(self._train[mask] - self._forward)
    except ValueError as e:  # e.g. a keras_model_fn that cannot be pickled
      return {'memory_note': f'not measured: {e}'}
    return {
        'client_extra_memory_bytes': float(np.mean(extras)),
        'client_extra_memory_bytes_max': int(max(extras)),
        'client_forward_memory_bytes': int(self._forward),
        'memory_note': (f'TF allocator peak of one training step (batch '
                        f'{self.batch_size}) minus the forward-only peak, '
                        f'mean over {len(masks)} client(s) of round 0'),
    }
