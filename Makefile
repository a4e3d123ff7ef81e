# The README's two commands: `make setup` and `make test`.
.PHONY: setup setup-bazel test test-other-cpu-path test-fast bazel-gen bazel-check bazel-test
PY := .venv/bin/python
PYTEST_WORKERS ?= 2
BAZEL ?= bazel
BAZEL_TARGETS ?= //tests/...
BAZEL_FLAGS ?=

setup:
	scripts/setup.sh

setup-bazel:
	scripts/setup.sh --bazel

# The whole pytest suite (unit, execution and real-data learning tests), then
# the tests whose figures depend on TensorFlow's CPU path once more on the
# other path (oneDNN on or off; TF turns it on by default on CPUs with AVX-512
# VNNI/BF16 or AMX, off on the others). --durations lists the 15 slowest
# tests, so a CI log shows where its time went.
test:
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile -q --durations=15 tests
	$(MAKE) test-other-cpu-path

CPU_PATH_TESTS := tests/memory_test.py tests/benchmark_test.py tests/determinism_test.py

# CPU_PATH_TESTS with TF_ENABLE_ONEDNN_OPTS flipped from what `make test` used.
test-other-cpu-path:
	@other=$$(TF_CPP_MIN_LOG_LEVEL=3 $(PY) -c 'from tensorflow.python.util import _pywrap_util_port as p; print(0 if p.IsMklEnabled() else 1)' 2>/dev/null) && \
	echo "== $(CPU_PATH_TESTS) again with TF_ENABLE_ONEDNN_OPTS=$$other" && \
	TF_ENABLE_ONEDNN_OPTS=$$other TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile -q $(CPU_PATH_TESTS)

# Bazel (offline, Debian's 4.2.3; see docs/bazel.md). BUILD files of the Python
# packages are generated from the sources' imports; the generator is stdlib-only.
bazel-gen:
	python3 scripts/gen_bazel_build.py

bazel-check:
	python3 scripts/gen_bazel_build.py --check

# Builds every target (a broken label anywhere fails here), then tests
# BAZEL_TARGETS with .venv/bin/python (the toolchain in //:BUILD), offline
# (.bazelrc). Example: make bazel-test BAZEL_TARGETS="//tests:comm_test"
bazel-test: bazel-check
	$(BAZEL) build $(BAZEL_FLAGS) //...
	$(BAZEL) test $(BAZEL_FLAGS) $(BAZEL_TARGETS)
