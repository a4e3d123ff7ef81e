"""Tests of `tff_partial.training.resumable`: reading a run's flags.json, removing partial writes."""

import json
import os

from absl.testing import absltest

from tff_partial.training import resumable


class ReadFlagsTest(absltest.TestCase):

  def _write(self, text):
    directory = self.create_tempdir().full_path
    with open(os.path.join(directory, resumable.FLAGS_FILE), 'w') as f:
      f.write(text)
    return directory

  def test_a_run_without_flags_json_reads_none(self):
    self.assertIsNone(resumable.read_flags(self.create_tempdir().full_path))

  def test_reads_the_recorded_flags(self):
    flags = {'task': 'emnist_cnn', 'client_learning_rate': 0.03, 'total_rounds': 300}
    self.assertEqual(resumable.read_flags(self._write(json.dumps(flags))), flags)

  def test_a_json_list_is_refused_naming_the_file(self):
    directory = self._write('[1, 2]')
    with self.assertRaisesRegex(ValueError, 'flags.json is not a JSON object of flags'):
      resumable.read_flags(directory)

  def test_broken_json_is_refused_naming_the_file(self):
    directory = self._write('{"task": ')
    with self.assertRaisesRegex(ValueError, r'flags\.json is not valid JSON'):
      resumable.read_flags(directory)


class RemoveStaleTempFilesTest(absltest.TestCase):

  def test_removes_only_the_partial_writes_of_tff_file_managers(self):
    run_dir = self.create_tempdir().full_path
    checkpoints = os.path.join(run_dir, resumable.CHECKPOINTS_DIR)
    kept = ['metrics.csv', 'flags.json', 'notes_temp', 'metrics.csv_temp123',
            os.path.join(resumable.CHECKPOINTS_DIR, 'program_state_25', 'saved_model.pb')]
    partial = ['metrics.csv_temp4389',
               os.path.join(resumable.CHECKPOINTS_DIR, 'program_state_50_temp1234',
                            'saved_model.pb')]
    for name in kept + partial:
      os.makedirs(os.path.dirname(os.path.join(run_dir, name)), exist_ok=True)
      with open(os.path.join(run_dir, name), 'w') as f:
        f.write('x')

    removed = resumable.remove_stale_temp_files(run_dir)

    self.assertEqual(removed, [os.path.join(checkpoints, 'program_state_50_temp1234'),
                               os.path.join(run_dir, 'metrics.csv_temp4389')])
    for name in kept:
      self.assertTrue(os.path.exists(os.path.join(run_dir, name)), name)
    self.assertEqual(sorted(os.listdir(checkpoints)), ['program_state_25'])
    self.assertEqual(resumable.remove_stale_temp_files(run_dir), [])

  def test_removes_what_a_killed_atomic_write_left(self):
    run_dir = self.create_tempdir().full_path
    kept = ['flags.json', 'model_weights.npz', 'notes.tmp', 'flags.json.123.tmp',
            'flags.json.123.0123ABCD.tmp', 'flags.json.x.0123abcd.tmp']
    partial = ['final_eval.json.4242.0123abcd.tmp', 'model_weights.npz.7.deadbeef.tmp']
    for name in kept + partial:
      with open(os.path.join(run_dir, name), 'w') as f:
        f.write('x')

    removed = resumable.remove_stale_temp_files(run_dir)

    self.assertEqual(removed, [os.path.join(run_dir, name) for name in partial])
    self.assertEqual(sorted(os.listdir(run_dir)), sorted(kept))

  def test_a_missing_run_directory_has_nothing_to_remove(self):
    missing = os.path.join(self.create_tempdir().full_path, 'not_there')
    self.assertEqual(resumable.remove_stale_temp_files(missing), [])
    self.assertFalse(os.path.exists(missing))


if __name__ == '__main__':
  absltest.main()
