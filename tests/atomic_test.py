"""Atomic output writes (tff_partial/training/atomic.py): kills and faults mid-write."""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
from unittest import mock

from tff_partial.training import atomic

_REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


class AtomicWriteTest(unittest.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = tempfile.mkdtemp()
    self.path = os.path.join(self.dir, 'final_eval.json')
    with open(self.path, 'w') as f:
      f.write('old')

  def _leftovers(self):
    return sorted(n for n in os.listdir(self.dir) if n != 'final_eval.json')

  def test_writes_and_replaces(self):
    with atomic.atomic_write(self.path) as f:
      f.write('new')
    with open(self.path) as f:
      self.assertEqual(f.read(), 'new')
    self.assertEqual(self._leftovers(), [])

  def test_fault_between_write_and_replace_keeps_the_old_file(self):
    with mock.patch.object(os, 'replace', side_effect=OSError('disk gone')):
      with self.assertRaisesRegex(OSError, 'disk gone'):
        with atomic.atomic_write(self.path) as f:
          f.write('new')
    with open(self.path) as f:
      self.assertEqual(f.read(), 'old')
    self.assertEqual(self._leftovers(), [])  # the temporary file is removed

  def test_error_inside_the_block_keeps_the_old_file(self):
    with self.assertRaises(KeyError):
      with atomic.atomic_write(self.path, 'wb') as f:
        f.write(b'half')
        raise KeyError('serializer failed')
    with open(self.path) as f:
      self.assertEqual(f.read(), 'old')

  def test_process_killed_mid_write_leaves_the_old_file(self):
    # The child writes 1 MB blocks forever into the temporary file; it is
    # killed (SIGKILL, no cleanup) once several blocks are on disk.
    code = textwrap.dedent(f'''
        import sys, time
        sys.path.insert(0, {_REPO!r})
        from tff_partial.training import atomic
        with atomic.atomic_write({self.path!r}) as f:
          while True:
            f.write('x' * (1 << 20))
            f.flush()
            print('block', flush=True)
            time.sleep(0.01)
        ''')
    child = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, text=True)
    for _ in range(3):
      self.assertEqual(child.stdout.readline().strip(), 'block')
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    child.stdout.close()
    with open(self.path) as f:
      self.assertEqual(f.read(), 'old')
    # What a kill leaves is a temporary file beside it, never the target.
    for name in self._leftovers():
      self.assertRegex(name, r'^final_eval\.json\.\d+\.[0-9a-f]{8}\.tmp$')
      self.assertRegex(name, atomic.TEMP_NAME)  # what a resumed run removes
      self.assertGreaterEqual(os.path.getsize(os.path.join(self.dir, name)), 3 << 20)

  def test_bad_mode(self):
    with self.assertRaisesRegex(ValueError, 'mode'):
      with atomic.atomic_write(self.path, 'a'):
        pass


if __name__ == '__main__':
  unittest.main()
