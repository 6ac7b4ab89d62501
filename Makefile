# The two commands a newcomer needs: `make serve` and `make test`.
# Both create the virtual environment and install everything on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: serve test bench clean peer-check

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e ".[test,bench]"
	touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/kernel serve $(if $(filter --model-repository% --model-store%,$(ARGS)),,--model-repository model_repo_examples) $(ARGS)

test: $(STAMP) redis-server
	$(PY) -m pytest -q $(PYTEST_ARGS)

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
bench: $(STAMP)
	$(PY) benchmarks/peers.py install
	$(PY) benchmarks/suite.py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info

# Compatibility checks against real peers (real Triton via ../shared/bench/anchors.sh); not part of `make test`.
# The differential check (peer_checks/test_differential.py) prints its summary line last;
# peer_checks/differences.py lists the known differences. Installs real Triton once.
ANCHORS_DIR ?= $(HOME)/.cache/kernel-anchors
peer-check: $(STAMP)
	test -n "$(wildcard $(ANCHORS_DIR)/lib/python3*/site-packages/pytriton/tritonserver/bin/tritonserver)" \
	  || bash ../shared/bench/anchors.sh install
	$(PY) -m pytest -q -p no:cacheprovider --basetemp=/tmp/kernel-peer-check peer_checks $(PYTEST_ARGS)
