"""Tests of tasks/registry.py and the EMNIST task family (no data loaded)."""

import io
import os
import subprocess
import sys
import tarfile
from unittest import mock

from absl.testing import absltest
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import data_utils
from tasks import emnist
from tasks import registry

_SPEC = tff.simulation.baselines.ClientSpec(num_epochs=1, batch_size=4)


class RegistryTest(absltest.TestCase):

  def test_emnist_tasks_are_registered(self):
    names = registry.task_names()
    for name in ('emnist_cnn', 'emnist_cnn_gn', 'emnist_2nn'):
      self.assertIn(name, names)

  def test_unknown_task_names_the_flag_and_valid_tasks(self):
    with self.assertRaises(registry.TaskError) as cm:
      registry.create_task('no_such_task', train_client_spec=_SPEC)
    message = str(cm.exception)
    self.assertIn("--task='no_such_task'", message)
    for name in registry.task_names():
      self.assertIn(name, message)
    self.assertIsInstance(cm.exception, ValueError)

  def test_unknown_hparam_is_rejected_before_loading_data(self):
    with self.assertRaisesRegex(registry.TaskError, r"no hyperparameter\(s\) \['bogus'\]"):
      registry.create_task('emnist_cnn', train_client_spec=_SPEC, bogus=1)

  def test_unavailable_data_source_names_valid_values(self):
    with self.assertRaises(registry.TaskError) as cm:
      registry.create_task('emnist_2nn', train_client_spec=_SPEC, data_source='jpeg')
    self.assertIn("--data_source='jpeg'", str(cm.exception))
    self.assertIn('auto, tff, leaf, synthetic', str(cm.exception))

  def test_max_train_batches_counts_batches_after_preprocessing(self):
    spec = tff.simulation.baselines.ClientSpec(num_epochs=2, batch_size=4)
    task = registry.create_task('emnist_2nn', train_client_spec=spec,
                                data_source='synthetic')
    client = task.train_data.client_ids[0]
    data = task.train_data.create_tf_dataset_for_client(client)
    full = list(task.baseline.datasets.train_preprocess_fn(data))
    self.assertGreater(len(full), 3)
    limited = task.with_max_train_batches(3)
    batches = list(limited.baseline.datasets.train_preprocess_fn(data))
    self.assertLen(batches, 3)  # batches of 4 examples, not 3 examples
    self.assertEqual([int(b[0].shape[0]) for b in batches], [4, 4, 4])
    self.assertIs(task.with_max_train_batches(-1), task)
    self.assertEqual(limited.population, task.population)

  def test_batched_epochs_batch_each_epoch_on_its_own(self):
    def batch_sizes(task, data):
      return [int(b[0].shape[0]) for b in task.baseline.datasets.train_preprocess_fn(data)]

    def passes(sizes):
      # TFF's EMNIST preprocessing maps batches with deterministic=False, so
      # without op determinism (the binaries' default turns it on) a pass's
      # two batches may come in either order: group the batches into passes
      # of the client's 5 examples and sort within each.
      groups, current = [], []
      for size in sizes:
        current.append(size)
        if sum(current) == 5:
          groups.append(sorted(current))
          current = []
      return groups + ([sorted(current)] if current else [])

    def build(epochs):
      return registry.create_task(
          'emnist_2nn', data_source='synthetic',
          train_client_spec=tff.simulation.baselines.ClientSpec(num_epochs=epochs, batch_size=4))

    task = build(epochs=1)
    data = task.train_data.create_tf_dataset_for_client(task.train_data.client_ids[0]).take(5)
    self.assertEqual(passes(batch_sizes(task, data)), [[1, 4]])
    # TFF's ClientSpec.num_epochs repeats the 5 examples, then batches the 10.
    self.assertEqual(sorted(batch_sizes(build(epochs=2), data)), [2, 4, 4])
    # Keras epochs: each pass over the examples ends with its own partial batch.
    self.assertEqual(passes(batch_sizes(task.with_batched_epochs(2), data)), [[1, 4]] * 2)
    self.assertEqual(passes(batch_sizes(task.with_batched_epochs(3), data)), [[1, 4]] * 3)
    # The cap counts the batches of all passes together.
    capped = batch_sizes(task.with_batched_epochs(2).with_max_train_batches(3), data)
    self.assertLen(capped, 3)
    self.assertEqual(passes(capped)[0], [1, 4])
    self.assertIs(task.with_batched_epochs(1), task)
    with self.assertRaisesRegex(registry.TaskError, '--client_epochs=0 must be a positive'):
      task.with_batched_epochs(0)

  def test_all_tasks_registered_when_a_task_module_is_imported_first(self):
    # Fresh interpreter: here the registry is already complete.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ('from tasks import stackoverflow\n'
            'from tasks import registry\n'
            'print(",".join(registry.task_names()))')
    out = subprocess.run([sys.executable, '-c', code], cwd=root, check=True,
                         capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=root)).stdout
    names = out.strip().splitlines()[-1].split(',')
    self.assertContainsSubset(
        ['emnist_cnn', 'emnist_2nn', 'stackoverflow_nwp', 'shakespeare_word'], names)

  def test_duplicate_registration_raises(self):
    with self.assertRaisesRegex(ValueError, 'already registered'):
      registry.register_task('emnist_cnn', lambda **_: None, flag_prefix='emnist')


class PreprocessTrainClientTest(absltest.TestCase):
  """`Task.preprocess_train_client`: the eager batches, traced once."""

  def _batches(self, dataset):
    return [tf.nest.flatten(b) for b in dataset.as_numpy_iterator()]

  def assertSameBatches(self, a, b):
    self.assertLen(a, len(b))
    for x, y in zip(a, b):
      for u, v in zip(x, y, strict=True):
        np.testing.assert_array_equal(u, v)

  def test_traced_once_and_same_batches_as_eager(self):
    for name in ('shakespeare_word', 'stackoverflow_tags'):
      task = registry.create_task(name, data_source='synthetic',
                                  train_client_spec=tff.simulation.baselines.ClientSpec(
                                      num_epochs=1, batch_size=4, shuffle_buffer_size=1))
      for client in task.train_data.client_ids:
        raw = task.train_data.create_tf_dataset_for_client(client)
        eager = self._batches(task.baseline.datasets.train_preprocess_fn(raw))
        self.assertNotEmpty(eager)
        self.assertSameBatches(self._batches(task.preprocess_train_client(raw)), eager)
      self.assertEqual(task._traced_train_preprocess.experimental_get_tracing_count(), 1)

  def test_random_preprocessing_stays_eager(self):
    # CIFAR-10's crops and flips take their seeds from the global seed, which
    # the training loop sets per client: a traced copy would keep the first.
    task = registry.create_task('cifar10_resnet18', train_client_spec=_SPEC,
                                data_source='synthetic')
    # One example: with more, the parallel map hands the random draws to the
    # examples in any order unless op determinism is on (process-wide).
    raw = task.train_data.create_tf_dataset_for_client(task.train_data.client_ids[0]).take(1)
    runs = {}
    for seed in (1, 2):
      tf.random.set_seed(seed)
      runs[seed] = self._batches(task.preprocess_train_client(raw))
      tf.random.set_seed(seed)
      self.assertSameBatches(runs[seed], self._batches(task.baseline.datasets.train_preprocess_fn(raw)))
    self.assertFalse(np.array_equal(runs[1][0][0], runs[2][0][0]))


# Small hyperparameters for the tasks whose defaults make big models.
_SMALL_HPARAMS = {
    'cifar10_resnet18': dict(num_clients=2, examples_per_client=4, width=4),
    'shakespeare_char': dict(units=8),
    'shakespeare_word': dict(vocab_size=50, units=8),
    'stackoverflow_nwp': dict(vocab_size=50, embed_dim=8, num_heads=2, ffn_dim=8,
                              num_layers=1),
    'stackoverflow_tags': dict(vocab_size=50, num_tags=5),
}


def _weights(model) -> list:
  return [(w.name, tuple(w.shape)) for w in model.weights]


class ModelWithoutDataTest(absltest.TestCase):
  """`registry.keras_model_fn`: the task's model from its hparams, no data read."""

  def test_every_builtin_task_builds_the_model_of_its_built_task(self):
    names = list(_SMALL_HPARAMS) + ['emnist_cnn', 'emnist_cnn_gn', 'emnist_2nn']
    self.assertCountEqual(names, registry.task_names())  # the built-in tasks
    for name in names:
      with self.subTest(name):
        hparams = _SMALL_HPARAMS.get(name, {})
        model_fn = registry.keras_model_fn(name, **hparams)
        self.assertIsNotNone(model_fn, f'{name} registered no model_fn')
        task = registry.create_task(name, train_client_spec=_SPEC, data_source='synthetic',
                                    **hparams)
        with tf.Graph().as_default():
          without_data = model_fn()
        with tf.Graph().as_default():
          built = task.keras_model_fn()
        self.assertEqual(_weights(without_data), _weights(built))
        self.assertEqual(without_data.count_params(), built.count_params())
    self.assertEqual(registry.keras_model_fn('emnist_cnn')().count_params(), 1_690_046)

  def test_bad_hparams_name_the_flag_before_a_model_is_built(self):
    with self.assertRaisesRegex(registry.TaskError, r'^--cifar10_width=0 must be a positive'):
      registry.keras_model_fn('cifar10_resnet18', width=0)()
    with self.assertRaisesRegex(registry.TaskError, r'^--stackoverflow_nwp_dropout=1.0 must'):
      registry.keras_model_fn('stackoverflow_nwp', dropout=1.0)()
    with self.assertRaisesRegex(registry.TaskError, r"no hyperparameter\(s\) \['bogus'\]"):
      registry.keras_model_fn('shakespeare_char', bogus=1)

  def test_a_task_registered_without_model_fn_has_none(self):
    name = 'registry_test_no_model_fn'
    registry.register_task(name, lambda **unused: None, flag_prefix=name)
    try:
      self.assertIsNone(registry.keras_model_fn(name))
    finally:
      registry.task_specs().pop(name)


class EmnistModelsTest(absltest.TestCase):

  def test_parameter_counts(self):
    # conv1 832 + conv2 51,264 + dense1 1,606,144 + dense2 31,806.
    self.assertEqual(emnist.create_cnn().count_params(), 1_690_046)
    # + GroupNorm gamma and beta over conv2's 64 channels.
    self.assertEqual(emnist.create_cnn(group_norm=True).count_params(), 1_690_174)
    # dense1 157,000 + dense2 40,200 + dense3 12,462.
    self.assertEqual(emnist.create_2nn().count_params(), 209_662)

  def test_stable_layer_names(self):
    names = [layer.name for layer in emnist.create_cnn(group_norm=True).layers]
    self.assertEqual(names, ['conv1', 'pool1', 'conv2', 'group_norm', 'pool2',
                             'flatten', 'dense1', 'dense2'])
    self.assertEqual([layer.name for layer in emnist.create_2nn().layers],
                     ['flatten', 'dense1', 'dense2', 'dense3'])


class UnpackArchiveTest(absltest.TestCase):
  """tasks.data_utils.unpack_if_archive: one shared cache, several processes."""

  def _archive(self, directory):
    path = os.path.join(directory, 'sample.tar.gz')
    with tarfile.open(path, 'w:gz') as tar:
      data = b'hello'
      info = tarfile.TarInfo('sample/a.txt')
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
    return path

  def test_unpacks_once_into_the_cache(self):
    tmp = self.create_tempdir().full_path
    root = data_utils.unpack_if_archive(
        self._archive(tmp), os.path.join(tmp, 'cache'), flag='--data_dir',
        must_contain=('a.txt',))
    with open(os.path.join(root, 'a.txt')) as f:
      self.assertEqual(f.read(), 'hello')
    self.assertEqual(os.listdir(os.path.join(tmp, 'cache')),
                     [os.path.basename(os.path.dirname(root))])

  def test_losing_the_race_to_another_process_uses_its_copy(self):
    # Another process renames its unpacked copy into place between this
    # process's check and its own rename: Linux's rename(2) then fails with
    # ENOTEMPTY (a sweep's parallel runs hit this), which is not an error.
    tmp = self.create_tempdir().full_path
    cache = os.path.join(tmp, 'cache')
    real_rename = os.rename

    def rename_after_the_winner(src, dst):
      os.makedirs(os.path.join(dst, 'sample'))
      with open(os.path.join(dst, 'sample', 'a.txt'), 'w') as f:
        f.write('winner')
      real_rename(src, dst)

    with mock.patch.object(data_utils.os, 'rename', rename_after_the_winner):
      root = data_utils.unpack_if_archive(
          self._archive(tmp), cache, flag='--data_dir', must_contain=('a.txt',))
    with open(os.path.join(root, 'a.txt')) as f:
      self.assertEqual(f.read(), 'winner')
    # This process's temporary copy is removed.
    self.assertLen(os.listdir(cache), 1)

  def test_other_unpack_errors_name_the_flag(self):
    tmp = self.create_tempdir().full_path
    path = os.path.join(tmp, 'broken.tar.gz')
    with open(path, 'wb') as f:
      f.write(b'not a tar file')
    with self.assertRaises(registry.TaskError) as cm:
      data_utils.unpack_if_archive(path, os.path.join(tmp, 'cache'), flag='--data_dir')
    self.assertIn("--data_dir='", str(cm.exception))
    self.assertIn('could not be unpacked', str(cm.exception))


if __name__ == '__main__':
  absltest.main()
