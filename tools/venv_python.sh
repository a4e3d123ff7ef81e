#!/usr/bin/env bash
# The interpreter of the Bazel Python toolchain (//:venv_py_runtime): runs the
# project's .venv/bin/python, wherever the repository was cloned.
#
# Bazel runs this file through a symlink in the runfiles tree; following the
# symlinks leads back to <repo>/tools/venv_python.sh in the source tree, and
# the .venv sits beside tools/. No absolute path is written anywhere.
set -euo pipefail
self="$(readlink -f "${BASH_SOURCE[0]}")"
repo="$(dirname "$(dirname "$self")")"
py="$repo/.venv/bin/python"
if [ ! -x "$py" ]; then
  echo "tools/venv_python.sh: $py not found; run 'make setup' in $repo first" >&2
  exit 1
fi
exec "$py" "$@"
