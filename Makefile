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

serve: $(RUNTIME_STAMP)
	$(VENV)/bin/kernel serve $(if $(filter --model-repository% --model-store%,$(ARGS)),,--model-repository model_repo_examples) $(ARGS)

test: $(TEST_STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

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
