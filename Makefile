# `make demo` and `make test` work on a fresh machine: each creates (or reuses)
# the virtual environment in .venv, installs the project with its test extra,
# then runs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q

demo: $(STAMP)
	$(BIN)/zmqflow demo

bench: $(STAMP)
	$(BIN)/zmqflow bench broker --json

clean:
	rm -rf $(VENV) build *.egg-info
