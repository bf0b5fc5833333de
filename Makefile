# The two commands a newcomer runs (README.md): `make demo` and `make test`.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python

.PHONY: setup demo test test-unit test-root bench plugin fuzz clean

setup:
	@bash scripts/setup.sh

demo: setup
	@bash scripts/demo.sh

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: setup
	$(PY) -m pytest -m "not root" $(PYTEST_ARGS)

test-root: setup
	$(PY) -m pytest -m root $(PYTEST_ARGS)

# Coverage-guided fuzzing (atheris) of the wire decoder, ingest, the plugin datagram decoder,
# the nccl collector and the federation owner's receive path: FUZZ_SECONDS per target (default
# 300); prints executions and crashes.
# `make test` runs a 3-second pass of each (tests/fuzz/test_fuzz.py).
fuzz: setup
	$(PY) -m tests.fuzz.run --seconds $${FUZZ_SECONDS:-300}

bench: setup
	@bash bench/run.sh

plugin:
	$(MAKE) -C plugin

clean:
	rm -rf $(VENV) build *.egg-info
	[ ! -f plugin/Makefile ] || $(MAKE) -C plugin clean
