"""Atomic writes of run outputs: a temporary file beside the target, then `os.replace`.

A process killed while writing leaves the previous version of the file (or
no file) at the target path, never a partial one; `os.replace` is atomic on
POSIX within one file system, hence the temporary file in the same folder.
Python has no such writer in its standard library; this one is small.
"""

import contextlib
import os
import re
import uuid

# The name of the temporary file beside `path`: `<path>.<pid>.<8 hex>.tmp`. A
# process killed mid-write (SIGKILL: no cleanup runs) leaves it behind;
# `resumable.remove_stale_temp_files` removes those in a run directory.
TEMP_NAME = re.compile(r'\.[0-9]+\.[0-9a-f]{8}\.tmp$')


@contextlib.contextmanager
def atomic_write(path: str, mode: str = 'w', **open_kwargs):
  """Opens a temporary file for writing; on success it replaces `path`.

  Args:
    path: the file to write.
    mode: 'w' (text) or 'wb' (binary).
    **open_kwargs: passed to `open` (e.g. `newline=''` for CSV).

  Yields:
    The open temporary file. If the block raises, `path` is left as it was and
    the temporary file is removed.
  """
  if mode not in ('w', 'wb'):
    raise ValueError(f'mode={mode!r}; valid values: w, wb')
  tmp = f'{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp'
  try:
    with open(tmp, mode, **open_kwargs) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise
