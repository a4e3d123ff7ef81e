"""Tests of the one training loop: resume equality, seeding, real-data learning."""

import csv
import os
import shutil

import numpy as np
import tensorflow as tf

from scripts.methods import fedavg
from tests import testing_utils
from tff_partial.training import loop
from tff_partial.training import method

_TIME_COLUMNS = ('training_time_in_seconds', 'evaluation/evaluation_time_in_seconds')


def _femnist_task(name, batch_size=20, max_elements=None):
  return testing_utils.femnist_task(name, batch_size=batch_size, max_elements=max_elements)


def _fedavg(task, client_lr=0.1, loop_implementation=None):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  extra = {} if loop_implementation is None else {'loop_implementation': loop_implementation}
  return fedavg.build(method.MethodContext(
      task=task,
      client_optimizer=tff.learning.optimizers.build_sgdm(learning_rate=client_lr),
      server_optimizer=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
      **extra,
  ))


def _rows(path):
  with open(path) as f:
    rows = list(csv.DictReader(f))
  return [{k: v for k, v in r.items() if k not in _TIME_COLUMNS} for r in rows]


_weights = testing_utils.load_npz_weights


class LoopTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.task = _femnist_task('emnist_2nn', max_elements=3)
    cls.built = _fedavg(cls.task)

  def _train(self, output_dir, total_rounds):
    return loop.run_training(
        self.task, self.built, total_rounds=total_rounds, clients_per_round=3, seed=7,
        output_dir=output_dir, rounds_per_checkpoint=2, print_fn=lambda _: None)

  def test_resumed_run_equals_uninterrupted_run(self):
    root = self.create_tempdir().full_path
    full_dir, resumed_dir = os.path.join(root, 'full'), os.path.join(root, 'resumed')
    self._train(full_dir, total_rounds=4)
    # A run killed during round 4: its last checkpoint is round 2, its CSV
    # already holds round 3, and it was killed while TFF wrote the CSV and a
    # checkpoint (each through a `_temp<4 digits>` copy, then a rename) and,
    # earlier, the weights (through `atomic`'s `.<pid>.<8 hex>.tmp` copy).
    self._train(resumed_dir, total_rounds=3)
    shutil.rmtree(os.path.join(resumed_dir, 'checkpoints', 'program_state_3'))
    os.remove(os.path.join(resumed_dir, 'model_weights.npz'))
    partial_csv = os.path.join(resumed_dir, 'metrics.csv_temp4389')
    partial_checkpoint = os.path.join(resumed_dir, 'checkpoints', 'program_state_4_temp1234')
    partial_weights = os.path.join(resumed_dir, 'model_weights.npz.4242.0123abcd.tmp')
    shutil.copyfile(os.path.join(resumed_dir, 'metrics.csv'), partial_csv)
    shutil.copytree(os.path.join(resumed_dir, 'checkpoints', 'program_state_2'),
                    partial_checkpoint)
    with open(partial_weights, 'wb') as f:
      f.write(b'half')
    self._train(resumed_dir, total_rounds=4)
    self.assertFalse(os.path.exists(partial_csv))
    self.assertFalse(os.path.exists(partial_checkpoint))
    self.assertFalse(os.path.exists(partial_weights))

    full, resumed = _weights(os.path.join(full_dir, 'model_weights.npz')), _weights(
        os.path.join(resumed_dir, 'model_weights.npz'))
    self.assertLen(resumed, len(full))
    for a, b in zip(full, resumed):
      np.testing.assert_array_equal(a, b)
    full_rows = _rows(os.path.join(full_dir, 'metrics.csv'))
    self.assertLen(full_rows, 5)
    self.assertEqual(full_rows, _rows(os.path.join(resumed_dir, 'metrics.csv')))

  def test_both_client_loops_train_bit_identical_weights(self):
    # `--client_loop=auto` picks dataset.reduce or the iterator loop per task
    # and CPU (client_loop.py), and a run may resume on the other one
    # (resumable.RESUMABLE_FLAG_CHANGES): the choice must not change the result.
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    weights = []
    for impl in (tff.learning.LoopImplementation.DATASET_REDUCE,
                 tff.learning.LoopImplementation.DATASET_ITERATOR):
      out = os.path.join(self.create_tempdir().full_path, 'run')
      loop.run_training(
          self.task, _fedavg(self.task, loop_implementation=impl), total_rounds=2,
          clients_per_round=3, seed=7, output_dir=out, print_fn=lambda _: None)
      weights.append(_weights(os.path.join(out, 'model_weights.npz')))
    self.assertLen(weights[0], 6)
    for a, b in zip(*weights):
      self.assertAllEqual(a, b)

  def test_rerun_of_a_finished_run_is_a_no_op(self):
    # 3 rounds, checkpoints every 2: the final state (round 3) is saved by the
    # loop itself; a rerun used to save it again (ProgramStateExistsError).
    out = os.path.join(self.create_tempdir().full_path, 'run')
    first = self._train(out, total_rounds=3)
    names = ('final_eval.json', 'model_weights.npz', 'metrics.csv', 'flags.json')

    def snapshot():
      files = {}
      for name in names:
        path = os.path.join(out, name)
        if os.path.exists(path):
          with open(path, 'rb') as f:
            files[name] = (os.stat(path).st_mtime_ns, f.read())
      return files, sorted(os.listdir(os.path.join(out, 'checkpoints')))

    before = snapshot()
    lines = []
    again = loop.run_training(
        self.task, self.built, total_rounds=3, clients_per_round=3, seed=7,
        output_dir=out, rounds_per_checkpoint=2, print_fn=lines.append)
    self.assertEqual(lines, [f'{out} holds a finished run (round 3/3); nothing to do'])
    self.assertEqual(snapshot(), before)
    self.assertEqual(again.final_eval, first.final_eval)
    # Fewer rounds than checkpointed: a clear error, nothing written.
    with self.assertRaisesRegex(loop.RunConfigMismatchError, 'round 3, beyond --total_rounds=2'):
      self._train(out, total_rounds=2)
    self.assertEqual(snapshot(), before)

  def test_run_killed_after_its_last_checkpoint_writes_its_outputs_on_rerun(self):
    out = os.path.join(self.create_tempdir().full_path, 'run')
    self._train(out, total_rounds=3)
    weights = _weights(os.path.join(out, 'model_weights.npz'))
    with open(os.path.join(out, 'final_eval.json')) as f:
      final_eval = f.read()
    # Killed between the round-3 checkpoint and the final outputs.
    os.remove(os.path.join(out, 'final_eval.json'))
    os.remove(os.path.join(out, 'model_weights.npz'))
    self._train(out, total_rounds=3)
    with open(os.path.join(out, 'final_eval.json')) as f:
      self.assertEqual(f.read(), final_eval)
    for a, b in zip(weights, _weights(os.path.join(out, 'model_weights.npz'))):
      np.testing.assert_array_equal(a, b)
    self.assertLen(_rows(os.path.join(out, 'metrics.csv')), 4)

  def test_same_seed_same_run_and_other_seed_differs(self):
    a = loop.run_training(self.task, self.built, total_rounds=1, clients_per_round=2, seed=3,
                          output_dir=None, print_fn=lambda _: None)
    b = loop.run_training(self.task, self.built, total_rounds=1, clients_per_round=2, seed=3,
                          output_dir=None, print_fn=lambda _: None)
    c = loop.run_training(self.task, self.built, total_rounds=1, clients_per_round=2, seed=4,
                          output_dir=None, print_fn=lambda _: None)
    self.assertEqual(a.final_eval, b.final_eval)
    self.assertNotEqual(a.final_eval, c.final_eval)

  def test_initial_weights_are_seeded(self):
    w1 = loop.initial_model_weights(self.task, 5).trainable
    w2 = loop.initial_model_weights(self.task, 5).trainable
    w3 = loop.initial_model_weights(self.task, 6).trainable
    for a, b in zip(w1, w2):
      np.testing.assert_array_equal(a, b)
    self.assertFalse(np.array_equal(w1[0], w3[0]))


  def test_client_values_have_autotuning_off_and_the_same_elements(self):
    client_id = self.task.train_data.client_ids[0]
    value = loop.client_value(self.task, self.built, 7, 3, 1, client_id)
    self.assertFalse(value.options().autotune.enabled)
    raw = loop.seeded_shuffle(self.task.train_data.create_tf_dataset_for_client(client_id),
                              7, 3, 1)
    expected = self.task.baseline.datasets.train_preprocess_fn(raw)
    self.assertIsNone(expected.options().autotune.enabled)  # tf.data's default: on.
    got, want = list(value.as_numpy_iterator()), list(expected.as_numpy_iterator())
    self.assertLen(got, 1)
    for a, b in zip(got, want):
      np.testing.assert_array_equal(a[0], b[0])
      np.testing.assert_array_equal(a[1], b[1])
    # A structure of datasets (PVT's data and mask, select's data and keys).
    both = loop.autotune_off({'data': expected, 'mask': tf.data.Dataset.range(1), 'n': 3})
    self.assertFalse(both['data'].options().autotune.enabled)
    self.assertFalse(both['mask'].options().autotune.enabled)
    self.assertEqual(both['n'], 3)

class FlagsFileTest(tf.test.TestCase):
  """`check_or_save_flags`: what may differ when a run is resumed."""

  def test_a_flag_newer_than_the_saved_file_resumes_only_at_its_default(self):
    out = self.create_tempdir().full_path
    loop.check_or_save_flags(out, {'task': 'emnist_cnn', 'seed': 0})
    defaults = {'eval_split': 'test', 'seed': 0, 'task': 'emnist_cnn'}
    loop.check_or_save_flags(out, {'task': 'emnist_cnn', 'seed': 0, 'eval_split': 'test'},
                             defaults)
    with self.assertRaisesRegex(loop.RunConfigMismatchError,
                                "--eval_split: saved 'test' vs now 'validation'"):
      loop.check_or_save_flags(
          out, {'task': 'emnist_cnn', 'seed': 0, 'eval_split': 'validation'}, defaults)
    with self.assertRaisesRegex(loop.RunConfigMismatchError, '--seed: saved 0 vs now 1'):
      loop.check_or_save_flags(out, {'task': 'emnist_cnn', 'seed': 1}, defaults)
    # Where clients run is not what they compute.
    loop.check_or_save_flags(out, {'task': 'emnist_cnn', 'seed': 0, 'workers': ['a:1'],
                                   'worker_max_clients_per_subround': 5})

  def test_a_run_resumed_on_another_cpu_path_resumes_with_a_warning(self):
    out = self.create_tempdir().full_path
    flags = {'task': 'emnist_cnn', 'seed': 0, 'cpu_path_resolved': 'CPU A; oneDNN on'}
    loop.check_or_save_flags(out, flags)
    with self.assertNoLogs(level='WARNING'):
      loop.check_or_save_flags(out, flags)
    with self.assertLogs(level='WARNING') as logs:
      loop.check_or_save_flags(out, {**flags, 'cpu_path_resolved': 'CPU B; oneDNN off'})
    self.assertIn('started on another CPU path (CPU A; oneDNN on) than it resumes on '
                  '(CPU B; oneDNN off)', logs.output[0])
    with open(os.path.join(out, 'flags.json')) as f:  # the record of where it started
      self.assertIn('CPU A; oneDNN on', f.read())


class FemnistFedAvgLearnsTest(tf.test.TestCase):
  """FedAvg on the real FEMNIST sample learns far above chance (1/62 = 1.6%)."""

  def test_fedavg_emnist_cnn_learns(self):
    task = _femnist_task('emnist_cnn')
    # Measured 2026-11-21 (seed 0, 30 rounds x 10 writers, client SGD 0.1,
    # batch 20, server SGD 1.0): test accuracy 0.373 on all 4,182 test images
    # of the 198 test writers (chance: 0.016). Asserted with a margin.
    testing_utils.train_and_assert_learns(
        self, task, _fedavg(task), rounds=30, min_accuracy=MIN_ACCURACY)

MIN_ACCURACY = 0.25

if __name__ == '__main__':
  tf.test.main()
