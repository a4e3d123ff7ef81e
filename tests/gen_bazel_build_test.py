"""Tests of scripts/gen_bazel_build.py on small fake source trees."""

import contextlib
import io
import os
import shutil
import tempfile

from absl.testing import absltest

from scripts import gen_bazel_build as gen


def _write(root, rel, text=''):
  path = os.path.join(root, rel)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    f.write(text)


def _read(root, rel):
  with open(os.path.join(root, rel)) as f:
    return f.read()


def _run(*argv):
  err = io.StringIO()
  with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
    rc = gen.main(list(argv))
  return rc, err.getvalue()


class GenBazelBuildTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.repo = tempfile.mkdtemp(dir=os.environ.get('TEST_TMPDIR'))
    self.addCleanup(shutil.rmtree, self.repo)
    _write(self.repo, 'tasks/__init__.py')
    _write(self.repo, 'tasks/registry.py', 'import tensorflow as tf\n')
    _write(self.repo, 'tff_partial/__init__.py')
    _write(self.repo, 'tff_partial/measure/comm.py', 'import numpy as np\n')
    _write(self.repo, 'tff_partial/select/keys.py',
           'from ..measure import comm\n'
           'def f():\n  from tasks import registry\n')
    _write(self.repo, 'scripts/__init__.py')
    _write(self.repo, 'scripts/flag_groups.py', 'from tasks import registry\n')
    _write(self.repo, 'scripts/methods/__init__.py',
           'import importlib\n'
           "def m(n):\n  return importlib.import_module(f'scripts.methods.{n}')\n")
    _write(self.repo, 'scripts/methods/fedavg.py',
           'from scripts import flag_groups\nimport tff_partial.select.keys\n')
    _write(self.repo, 'scripts/train.py',
           'from scripts import flag_groups\nfrom scripts import methods\n'
           "if __name__ == '__main__':\n  pass\n")
    _write(self.repo, 'tests/__init__.py')
    _write(self.repo, 'tests/testing_utils.py')
    _write(self.repo, 'tests/keys_test.py',
           '# bazel: tags=exclusive\nfrom tff_partial.select import keys\n')
    _write(self.repo, 'tests/train_test.py',
           'from scripts import train\nfrom tests import testing_utils\n'
           "testing_utils.shared_data('x')\n")

  def test_generates_libraries_binaries_and_tests(self):
    self.assertEqual(_run('--repo', self.repo)[0], 0)
    select = _read(self.repo, 'tff_partial/select/BUILD')
    self.assertIn('name = "select",\n    srcs = ["keys.py"],\n    deps = [\n'
                  '        "//tasks",\n        "//tff_partial/measure",\n    ],',
                  select)
    scripts = _read(self.repo, 'scripts/BUILD')
    self.assertIn('py_binary(\n    name = "train",', scripts)
    self.assertIn('deps = [\n        ":scripts",\n        "//scripts/methods",\n    ],',
                  scripts)
    methods = _read(self.repo, 'scripts/methods/BUILD')
    self.assertIn('"//scripts",\n        "//tff_partial/select",', methods)
    tests = _read(self.repo, 'tests/BUILD')
    self.assertIn('name = "keys_test",\n    size = "medium",', tests)
    self.assertIn('tags = ["exclusive"]', tests)
    # Reads real data: large. Binaries are deps like libraries.
    self.assertIn('name = "train_test",\n    size = "large",', tests)
    self.assertIn('":testing_utils",\n        "//scripts:train",', tests)
    self.assertIn('py_library(\n    name = "testing_utils",', tests)

  def test_check_reports_missing_and_stale_then_passes(self):
    rc, err = _run('--repo', self.repo, '--check')
    self.assertEqual(rc, 1)
    self.assertIn('missing: tests/BUILD', err)
    _run('--repo', self.repo)
    self.assertEqual(_run('--repo', self.repo, '--check')[0], 0)
    # A new test and a new folder make the check fail until regenerated.
    _write(self.repo, 'tests/comm_test.py', 'from tff_partial.measure import comm\n')
    _write(self.repo, 'tff_partial/frozen/seeds.py')
    rc, err = _run('--repo', self.repo, '--check')
    self.assertEqual(rc, 1)
    self.assertIn('stale: tests/BUILD', err)
    self.assertIn('missing: tff_partial/frozen/BUILD', err)
    _run('--repo', self.repo)
    self.assertEqual(_run('--repo', self.repo, '--check')[0], 0)
    # A folder that lost its modules leaves a stale BUILD, removed on write.
    os.remove(os.path.join(self.repo, 'tff_partial/frozen/seeds.py'))
    rc, err = _run('--repo', self.repo, '--check')
    self.assertIn('stale: tff_partial/frozen/BUILD (its folder has no .py', err)
    _run('--repo', self.repo)
    self.assertFalse(os.path.exists(os.path.join(self.repo, 'tff_partial/frozen/BUILD')))

  def test_output_is_deterministic(self):
    _run('--repo', self.repo)
    first = _read(self.repo, 'scripts/methods/BUILD')
    _run('--repo', self.repo)
    self.assertEqual(_read(self.repo, 'scripts/methods/BUILD'), first)

  def test_cycle_is_an_error_naming_it(self):
    _write(self.repo, 'scripts/flag_groups.py', 'from scripts import methods\n')
    rc, err = _run('--repo', self.repo)
    self.assertEqual(rc, 1)
    self.assertIn('//scripts -> //scripts/methods -> //scripts', err)
    self.assertFalse(os.path.exists(os.path.join(self.repo, 'scripts/BUILD')))

  def test_bad_directive_names_file_and_valid_values(self):
    _write(self.repo, 'tests/keys_test.py', '# bazel: size=huge\n')
    rc, err = _run('--repo', self.repo, '--check')
    self.assertEqual(rc, 1)
    self.assertIn('tests/keys_test.py:1', err)
    self.assertIn('small, medium, large, enormous', err)


if __name__ == '__main__':
  absltest.main()
