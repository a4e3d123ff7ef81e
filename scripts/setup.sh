#!/usr/bin/env bash
# One setup command: creates .venv and installs every pinned dependency plus this
# project (editable). Safe to run twice; the second run only checks the lock stamp.
#   scripts/setup.sh            # Python environment
#   scripts/setup.sh --bazel    # also Debian's Bazel 4.2.3 with offline overrides
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
WITH_BAZEL=0
for arg in "$@"; do
  case "$arg" in
    --bazel) WITH_BAZEL=1 ;;
    *) echo "setup.sh: unknown option '$arg' (allowed: --bazel)" >&2; exit 2 ;;
  esac
done

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.lock-installed
want="$(sha256sum requirements.lock setup.py | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade "pip>=23" 2>&1 | grep -v "^WARNING: Location" || true
  # --no-deps: TFF 0.87.0 pins jaxlib==0.4.14, which has no wheel for Python 3.11;
  # the lock replaces it with 0.4.18 and pins everything else exactly.
  .venv/bin/python -m pip install -q --no-deps -r requirements.lock 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v "^WARNING: Location" || true
  TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/python -c "import tensorflow_federated, tff_partial, tasks" 2>/dev/null || { echo "setup: import check failed" >&2; exit 1; }
  echo "$want" > "$stamp"
  echo "setup: .venv ready"
else
  echo "setup: .venv up to date"
fi

# TFF's worker_binary cannot choose its listening address: the package preloads
# a small shim into it that binds it to loopback (tff_partial/runtime/bind_shim.py,
# stdlib only). Build it now (it is cached; a missing one is built on first use).
.venv/bin/python tff_partial/runtime/bind_shim.py >/dev/null || { echo "setup: the worker bind shim could not be built" >&2; exit 1; }

if [ "$WITH_BAZEL" = 1 ]; then
  if ! command -v bazel >/dev/null 2>&1 || [ ! -d /usr/src/bazel-bootstrap/mock_repos ]; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq bazel-bootstrap bazel-bootstrap-source >/dev/null
  fi
  # Debian's build prints "bazel no_version"; the package version is the truth.
  echo "setup: bazel-bootstrap $(dpkg-query -W -f='${Version}' bazel-bootstrap 2>/dev/null || echo '?') ready (offline: .bazelrc, WORKSPACE; docs/bazel.md)"
fi
