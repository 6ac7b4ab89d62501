# The two commands a newcomer needs: `make serve` and `make test`.
# Both create the virtual environment on first use; `serve` installs Kernel's runtime only, `test`
# adds what the tests need, `bench` what the benchmarks need (one stamp each, redone when
# pyproject.toml changes). pip shows its progress.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
# An editable install maps kernel.transports and kernel.backends onto transports/ and backends/
# (pyproject's package-dir), which setuptools does with an import finder and announces with a
# five-line "Editable installation" warning on every install; it is informational, nothing is wrong.
BUILD_ENV := PYTHONWARNINGS="ignore:Editable installation"

RUNTIME_STAMP := $(VENV)/.installed-runtime
TEST_STAMP    := $(VENV)/.installed-test
BENCH_STAMP   := $(VENV)/.installed-bench

.PHONY: serve test bench clean peer-check

# A plain `pip install '.[extra]'` (without -e) into .venv replaces the editable install with a copy
# of the clone, which the stamps alone never notice: when .venv's `kernel` is not this clone's
# kernel/ folder, the runtime stamp goes and the editable install is redone (the test and bench
# stamps follow it).
ifneq ($(wildcard $(RUNTIME_STAMP)),)
ifneq ($(shell $(PY) -c "import importlib.util as u, os; s = u.find_spec('kernel'); print(s is not None and os.path.realpath(s.origin) == os.path.realpath('kernel/__init__.py'))" 2>/dev/null),True)
$(shell rm -f $(RUNTIME_STAMP))
endif
endif

$(PY):
	$(PYTHON) -m venv $(VENV)

$(RUNTIME_STAMP): pyproject.toml | $(PY)
	@echo "Installing Kernel (runtime only) into $(VENV)"
	$(BUILD_ENV) $(PIP) install -e .
	touch $@

$(TEST_STAMP): pyproject.toml $(RUNTIME_STAMP)
	@echo "Installing what the tests need into $(VENV)"
	$(BUILD_ENV) $(PIP) install -e ".[test]"
	touch $@

$(BENCH_STAMP): pyproject.toml $(RUNTIME_STAMP)
	$(BUILD_ENV) $(PIP) install -e ".[bench]"
	touch $@

# The OpenAI-compatible API listens on 9000 (as Triton's OpenAI frontend) unless ARGS names --openai-port.
serve: $(RUNTIME_STAMP)
	$(VENV)/bin/kernel serve $(if $(filter --model-repository% --model-store%,$(ARGS)),,--model-repository model_repo_examples) \
	  $(if $(filter --openai-port%,$(ARGS)),,--openai-port 9000) $(ARGS)

# Then the client-facing suites again, every server with two front processes (issue 32): to a
# client several fronts must be one server. Left out there: what is per front by design (the local
# response cache's hits, one "Redis unavailable" line per front), what keeps one front (hypercorn)
# and SageMaker's /models routes without SAGEMAKER_MULTI_MODEL (refused with several fronts: test_front_processes.py).
FRONTS_TESTS ?= tests/core tests/transports tests/loading
FRONTS_SKIP := --deselect tests/core/test_cache_key.py --deselect tests/core/test_response_cache.py \
  --deselect tests/core/test_redis_cache.py::test_redis_killed_mid_load_fails_no_request \
  --deselect tests/transports/test_http_infer.py::test_hypercorn_serves_the_same_api \
  --deselect tests/transports/test_sagemaker.py::test_multi_model_routes_without_multi_model_mode

test: $(TEST_STAMP) redis-server
	$(PY) -m pytest -q $(PYTEST_ARGS)
	KERNEL_TEST_SERVE_ARGS="--front-processes 2" $(PY) -m pytest -q $(FRONTS_TESTS) $(FRONTS_SKIP)

# The redis response cache tests start a real redis-server (Debian package redis-server). Installed
# with apt-get when missing; nothing is done (or printed) when it is there.
SUDO := $(shell [ "$$(id -u)" = 0 ] || command -v sudo)
.PHONY: redis-server
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  command -v apt-get >/dev/null 2>&1 || { echo "make test needs redis-server (the redis cache tests start one) and there is no apt-get here: install Redis (redis-server) by hand" >&2; exit 1; }; \
	  echo "installing redis-server with apt-get (the redis cache tests start one)"; \
	  $(SUDO) apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq redis-server >/dev/null; }

# Kernel vs real Triton on every scenario of issue 17 (benchmarks/suite.py); real Triton and
# perf_analyzer are installed from PyPI into benchmarks/.peers on first use. ARGS="--quick --rounds 1" to try it.
bench: $(BENCH_STAMP) $(TEST_STAMP)
	$(PY) benchmarks/peers.py install
	$(PY) benchmarks/suite.py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info

# Compatibility checks against real Triton 2.51, installed from PyPI into benchmarks/.peers on first
# use (benchmarks/peers.py; KERNEL_PEERS_DIR puts it elsewhere); not part of `make test`.
# The differential check (peer_checks/test_differential.py) prints its summary line last;
# peer_checks/differences.py lists the known differences.
peer-check: $(TEST_STAMP)
	$(PY) benchmarks/peers.py install --triton-only
	$(PY) -m pytest -q -p no:cacheprovider peer_checks $(PYTEST_ARGS)
