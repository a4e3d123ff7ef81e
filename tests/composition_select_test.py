"""Composition matrix: federated select (top, random_top, random, mixed) x aggregators.

See tests/composition_testing.py for the cases and the numpy reference (per-key
weighted mean; the paper's eq. (5) under DP; per-key median over the clients
that chose the key). Data-chosen keys under DP are refused at flag validation.
Also: an output layer sliced by class without an OOV class drops the examples
of classes the client did not select.
"""

# bazel: size=large
import collections

import numpy as np
import tensorflow as tf

from tests import composition_testing
from tff_partial.select import slicing
from tff_partial.training import loop


class SelectMatrixTest(composition_testing.MatrixTestCase):

  def test_select_top(self):
    self.check_method('select_top')

  def test_select_random_top(self):
    self.check_method('select_random_top')

  def test_select_random(self):
    self.check_method('select_random')

  def test_select_mixed(self):
    self.check_method('select_mixed')


class OutputLayerWithoutOovTest(composition_testing.MatrixTestCase):
  """`dense3` (the 5-class output) sliced by top-2 class keys, no OOV class."""

  def test_remap_drops_examples_of_unselected_classes(self):
    model = composition_testing.keras_model()
    spec = slicing.make_select_spec(model, slicing.group_configs(model, ['dense3'], 2, 'top'))
    keys = {'dense3': np.array([1, 3], np.int32)}
    x = np.arange(4 * 8, dtype=np.float32).reshape(4, 8)
    y = np.array([3, 0, 1, 4], np.int32)
    bx, by = slicing.remap_batch(spec, keys, (tf.constant(x), tf.constant(y)))
    self.assertAllEqual(by, [1, 0])  # classes 3 and 1 -> local 1 and 0
    self.assertAllEqual(bx, x[[0, 2]])

  def test_client_update_is_that_of_its_selected_classes_only(self):
    task = self.task
    built, _ = composition_testing.build(
        task, dict(algorithm='select', select_layer=['dense3'], select_keys=2,
                   select_policy='top'), 'mean')
    process = built.process
    weights = loop.initial_model_weights(task, 3)
    start = process.set_model_weights(process.initialize(), weights)
    preprocess = task.baseline.datasets.train_preprocess_fn
    raw = task.train_data.create_tf_dataset_for_client('c2')  # 5 examples
    value = built.client_input_fn(1, 0, 'c2', preprocess(raw))
    chosen = set(np.asarray(value['keys']['dense3']).tolist())
    labels = [int(e['y']) for e in raw]
    self.assertLess(sum(label in chosen for label in labels), len(labels))
    only_chosen = raw.filter(lambda e: tf.reduce_any(
        tf.equal(tf.cast(e['y'], tf.int32), tf.constant(sorted(chosen), tf.int32))))
    filtered = collections.OrderedDict(data=preprocess(only_chosen), keys=value['keys'])

    def update(v):
      after = process.get_model_weights(process.next(start, [v]).state)
      return [a - b for a, b in zip(weights.trainable, after.trainable)]

    for a, b in zip(update(value), update(filtered)):
      self.assertAllClose(a, b, rtol=1e-6, atol=1e-7)
    out = process.next(start, [value]).metrics
    self.assertEqual(int(out['client_work']['train']['num_examples']),
                     sum(label in chosen for label in labels))


if __name__ == '__main__':
  tf.test.main()
