# The README's two commands: `make setup` and `make test`.
.PHONY: setup setup-bazel test test-fast bazel-test bazel-check
PY := .venv/bin/python
PYTEST_WORKERS ?= 2

setup:
	scripts/setup.sh

setup-bazel:
	scripts/setup.sh --bazel

# The whole pytest suite (unit, execution and real-data learning tests).
test:
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile -q tests

bazel-check:
	$(PY) scripts/check_bazel_targets.py

bazel-test: bazel-check
	bazel test --python_path=$(abspath $(PY)) $(BAZEL_TARGETS)
