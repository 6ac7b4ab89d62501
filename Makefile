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

# The OpenAI-compatible API listens on 9000 (as Triton's OpenAI frontend) unless ARGS names --openai-port.
serve: $(STAMP)
	$(VENV)/bin/kernel serve $(if $(filter --model-repository% --model-store%,$(ARGS)),,--model-repository model_repo_examples) \
	  $(if $(filter --openai-port%,$(ARGS)),,--openai-port 9000) $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

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
