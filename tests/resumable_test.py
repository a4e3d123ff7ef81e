"""Tests of `tff_partial.training.resumable.read_flags`, the one reader of a run's flags.json."""

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


if __name__ == '__main__':
  absltest.main()
