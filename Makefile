# The two commands a newcomer runs (README.md): `make demo` and `make test`.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python

.PHONY: setup demo test test-unit test-root bench plugin clean

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

bench: setup
	@bash bench/run.sh

plugin:
	$(MAKE) -C plugin

clean:
	rm -rf $(VENV) build *.egg-info
	[ ! -f plugin/Makefile ] || $(MAKE) -C plugin clean
