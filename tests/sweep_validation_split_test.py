"""Tests of the validation split the sweep tunes on (`Task.with_validation_split`, --eval_split)."""

from absl import flags
from absl.testing import flagsaver
import numpy as np
import tensorflow as tf

from scripts import flag_groups
from tasks import registry
from tests import testing_utils
from tff_partial.training import loop


def _examples(dataset) -> list:
  """Each example as (label, hash of its pixels), in order."""
  return [(int(e['label']), hash(e['pixels'].numpy().tobytes())) for e in dataset]


class ValidationSplitTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.task = testing_utils.femnist_task('emnist_2nn')
    cls.split = cls.task.with_validation_split(0.1, seed=3)

  def test_holds_out_part_of_every_training_client_and_nothing_else(self):
    train, validation = self.split.train_data, self.split.baseline.datasets.validation_data
    self.assertEqual(train.client_ids, self.task.train_data.client_ids)
    self.assertIs(self.split.test_data, self.task.test_data)
    held_out = 0
    for client_id in self.task.train_data.client_ids[:10]:
      everything = _examples(self.task.train_data.create_tf_dataset_for_client(client_id))
      kept = _examples(train.create_tf_dataset_for_client(client_id))
      out = _examples(validation.create_tf_dataset_for_client(client_id))
      # The two parts together are the client's examples, each once (as a multiset:
      # a writer may have the same image twice).
      self.assertCountEqual(kept + out, everything)
      self.assertNotEmpty(kept)
      held_out += len(out)
    self.assertGreater(held_out, 0)
    # The loop's evaluation reads the held-out examples of all 110 writers:
    # about 0.1 of the 14,697 training images.
    self.assertEqual(self.split.eval_split, 'validation')
    evaluated = sum(int(b[1].shape[0]) for b in self.split.centralized_eval_dataset())
    self.assertBetween(evaluated / 14_697, 0.09, 0.11)
    self.assertEqual(self.task.eval_split, 'test')

  def test_split_traced_once_and_same_examples_as_eager(self):
    # A client's split is built by one tf.function traced on the first
    # client (an eager split kept memory per client and round); the eager
    # split (`_split`) picks the same examples in the same order.
    train = self.task.with_validation_split(0.1, seed=3).train_data
    base = self.task.train_data
    for client_id in base.client_ids[:10]:
      eager = _examples(train._split(base.create_tf_dataset_for_client(client_id), client_id))
      self.assertNotEmpty(eager)
      self.assertEqual(_examples(train.create_tf_dataset_for_client(client_id)), eager)
    self.assertEqual(train._traced_split.experimental_get_tracing_count(), 1)

  def test_same_seed_same_split_other_seed_other_split(self):
    client_id = self.task.train_data.client_ids[0]

    def held_out(seed):
      task = self.task.with_validation_split(0.1, seed=seed)
      return _examples(
          task.baseline.datasets.validation_data.create_tf_dataset_for_client(client_id))

    self.assertEqual(held_out(3), held_out(3))
    self.assertNotEqual(held_out(3), held_out(4))

  def test_evaluation_of_a_model_reads_the_split(self):
    # TFF's synthetic EMNIST: 2 writers x 10 images, the same images as test data.
    task = registry.create_task('emnist_2nn', train_client_spec=testing_utils.client_spec(),
                                data_source='synthetic')
    split = task.with_validation_split(0.5, seed=1)
    held_out = sum(int(b[1].shape[0]) for b in split.centralized_eval_dataset())
    self.assertBetween(held_out, 1, 19)
    weights = loop.initial_model_weights(task, 0)
    self.assertNotEqual(loop.evaluate(task, weights)['loss'],
                        loop.evaluate(split, weights)['loss'])


class EvalSplitFlagTest(tf.test.TestCase):

  def test_flags_build_the_split_and_reject_a_fraction_without_it(self):
    with flagsaver.flagsaver(task='emnist_2nn', data_source='synthetic', seed=2,
                             eval_split='validation', validation_fraction=0.5):
      task = flag_groups.create_task()
    self.assertEqual(task.eval_split, 'validation')
    self.assertIn('validation: 0.5 of the training examples held out (seed 2)',
                  task.data_description)
    with flagsaver.flagsaver(task='emnist_2nn', data_source='synthetic'):
      flags.FLAGS['validation_fraction'].present = 1
      try:
        with self.assertRaisesRegex(flag_groups.FlagError,
                                    '--validation_fraction applies only to --eval_split=validation'):
          flag_groups.create_task()
      finally:
        flags.FLAGS['validation_fraction'].present = 0
    with flagsaver.flagsaver(task='emnist_2nn', data_source='synthetic',
                             eval_split='validation', validation_fraction=1.0):
      with self.assertRaisesRegex(ValueError, r'--validation_fraction=1.0 must be in \(0, 1\)'):
        flag_groups.create_task()


if __name__ == '__main__':
  tf.test.main()
