"""The sweep manifest (`<sweep_dir>/sweep.json`) and the one-sweep-at-a-time lock.

The manifest records the spec and its digest (`SweepSpec.digest`). A sweep
directory holding another spec's manifest, or files but no manifest, is
refused before anything runs, so that two sweeps never share run directories.
"""

import datetime
import fcntl
import json
import os
from typing import Optional

from tff_partial.sweep import spec as spec_lib
from tff_partial.training import atomic

MANIFEST_FILE = 'sweep.json'
_LOCK_FILE = '.sweep.lock'


class SweepDirError(ValueError):
  """The sweep directory belongs to another sweep or is in use."""


def check(sweep_dir: str, spec: spec_lib.SweepSpec, flag: str = 'sweep_dir') -> bool:
  """True if `sweep_dir` holds this spec's sweep, False if new; else SweepDirError.

  flag: the flag the directory came from, named in the error (`bank_dir` for a bank).
  """
  path = os.path.join(sweep_dir, MANIFEST_FILE)
  if not os.path.exists(path):
    if os.path.isdir(sweep_dir) and any(not e.startswith('.') for e in os.listdir(sweep_dir)):
      raise SweepDirError(
          f'--{flag}={sweep_dir} is not empty and holds no {MANIFEST_FILE}: it is not a '
          'sweep directory; choose a new or empty directory')
    return False
  try:
    with open(path) as f:
      saved = json.load(f)
    saved_digest = saved['digest']
  except (OSError, ValueError, KeyError) as e:
    raise SweepDirError(f'{path} is not a sweep manifest ({e}); choose another --{flag}') from e
  if saved_digest != spec.digest():
    raise SweepDirError(
        f'--{flag}={sweep_dir} belongs to sweep {saved.get("name")!r} with another spec '
        f'(digest {saved_digest}, this spec {spec.digest()}); choose another --{flag}, or '
        f'rerun with the spec saved in {path}')
  return True


def write(sweep_dir: str, spec: spec_lib.SweepSpec, default_total_rounds: int,
          resume_from: Optional[str] = None, relative: bool = False) -> str:
  """Writes the manifest (atomically) unless this spec's is already there.

  It is written once the spec passed every check, so a sweep that finds its
  manifest need not check again; `default_total_rounds` (the training
  binary's) is recorded for that case, and so is `resume_from` (the earlier
  sweep it starts from), so that a rerun without `--resume_from` still copies
  the runs whose copy waits for their search (`tff_partial.sweep.carry`).
  With `relative` (a bank, which is committed and read from another
  checkout), `resume_from` is recorded relative to `sweep_dir`;
  `recorded_resume_from` resolves it.
  """
  path = os.path.join(sweep_dir, MANIFEST_FILE)
  if os.path.exists(path):
    return path
  os.makedirs(sweep_dir, exist_ok=True)
  record = {
      'name': spec.name,
      'digest': spec.digest(),
      'created': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
      'spec': spec.to_dict(),
      'default_total_rounds': default_total_rounds,
  }
  if resume_from is not None:
    record['resume_from'] = (
        os.path.relpath(os.path.abspath(resume_from), os.path.abspath(sweep_dir)) if relative
        else os.path.abspath(resume_from))
  with atomic.atomic_write(path) as f:
    json.dump(record, f, indent=2, sort_keys=True)
  return path


def read(sweep_dir: str) -> dict:
  """The manifest of `sweep_dir` (`spec`, `digest`, `default_total_rounds`, ...)."""
  with open(os.path.join(sweep_dir, MANIFEST_FILE)) as f:
    return json.load(f)


def recorded_resume_from(sweep_dir: str) -> Optional[str]:
  """The earlier sweep `sweep_dir` started from (its manifest's), as a path; None if none.

  A relative record (a bank's) is resolved against `sweep_dir`. The directory
  may be gone.
  """
  recorded = read(sweep_dir).get('resume_from')
  if recorded is None:
    return None
  return os.path.normpath(os.path.join(os.path.abspath(sweep_dir), recorded))


class Lock:
  """An exclusive `flock` on `<sweep_dir>/.sweep.lock` while a sweep runs there.

  Training subprocesses do not inherit it (Popen closes other descriptors).
  """

  def __init__(self, sweep_dir: str):
    self._path = os.path.join(sweep_dir, _LOCK_FILE)
    self._file = None

  def __enter__(self):
    os.makedirs(os.path.dirname(self._path), exist_ok=True)
    self._file = open(self._path, 'w')
    try:
      fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as e:
      self._file.close()
      raise SweepDirError(
          f'another sweep process is running in {os.path.dirname(self._path)}; wait for it '
          'or stop it first') from e
    self._file.write(str(os.getpid()))
    self._file.flush()
    return self

  def __exit__(self, *exc):
    fcntl.flock(self._file, fcntl.LOCK_UN)
    self._file.close()
