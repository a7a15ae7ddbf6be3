# `make demo` and `make test` work on a fresh machine: each creates (or reuses)
# the virtual environment in .venv, installs the locked dependencies
# (requirements/test.txt, hashes checked) and the project itself, then runs.
# pyproject.toml keeps the loose ranges for library users; `make lock` recompiles
# requirements/*.txt from them. pip installs without byte-compiling and compileall then compiles the environment on
# every core: the same .pyc files, half of pip's one-core 65 s set-up.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-security test-soak test-gpu test-torch test-containers test-netns test-browser examples bench venv lock clean

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py requirements/test.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --no-compile --require-hashes -r requirements/test.txt
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

# The lock files: core (pip install zmqflow), serve (core plus the http and grpc extras at core's versions: the
# Docker image, whose gateway serves HTTP and gRPC) and test (make test, make demo), for Python 3.10+ on any platform.
lock:
	$(PYTHON) -m venv .lock-venv && .lock-venv/bin/pip install --quiet uv
	.lock-venv/bin/uv pip compile pyproject.toml --generate-hashes --universal --python-version 3.10 \
		--no-header -q -o requirements/core.txt
	.lock-venv/bin/uv pip compile pyproject.toml --extra http --extra grpc -c requirements/core.txt --generate-hashes \
		--universal --python-version 3.10 --no-header -q -o requirements/serve.txt
	.lock-venv/bin/uv pip compile pyproject.toml --extra test --generate-hashes --universal --python-version 3.10 \
		--no-header -q -o requirements/test.txt
	rm -rf .lock-venv

# Tiers by marker (pyproject.toml): unit, service, integration, faults; slow, security, soak, gpu, torch, containers, netns, browser.
# Tests run in TEST_WORKERS processes (pytest-xdist; TEST_WORKERS=0 runs them in this one): most of a test's time is
# its services starting and answering, so 4 workers keep 2 cores busy. Each test still owns its processes, ports and
# folders (tests/support: ephemeral ports, port offsets by worker), so the tests run in any order and side by side.
TEST_WORKERS ?= 4
XDIST := -n $(TEST_WORKERS) --dist worksteal

# The tests start hundreds of service processes. Where PYTHONDONTWRITEBYTECODE is set (as on the CI machine)
# none of them writes the .pyc of the project's own modules, so each would compile them again (~0.1 s of CPU a start):
# compileall writes them once (and again only for the files that changed).
SOURCES := zmqflow common models inputs adapters services jobs cli bench loadtest data tests examples

test: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 $(SOURCES) > /dev/null
	$(BIN)/python -m pytest -q $(XDIST) --durations=15 -m "not containers and not netns and not gpu and not torch and not browser"

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) -m "(unit or service) and not slow"

# The soak tier (tests/soak/, docs/design.md's Memory habits) for minutes: each long-running service driven at full
# rate for SOAK_SECS seconds, failing when its RSS grows by over 16 MB, or its descriptors or threads by over 2, once
# warmed up. `make test` runs the same tier for 4 s a service.
SOAK_SECS ?= $(or $(SOAK_SECONDS),120)
test-soak: $(STAMP)
	ZMQFLOW_SOAK_SECS=$(SOAK_SECS) $(BIN)/python -m pytest -q -rs -s -m soak

# The security tier (tests/security/, docs/security.md): attacks that must be refused; part of make test too.
test-security: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) -m security

test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -m gpu

# The PyTorch adapter's tests: installs PyTorch's CPU build into .venv first (about 190 MB; not in the lock,
# like the GPU extra). TORCH_SPEC picks another build, e.g. TORCH_SPEC="torch==2.13.0" TORCH_INDEX=... for CUDA.
TORCH_SPEC ?= torch==2.13.0+cpu
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
test-torch: $(STAMP)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet "$(TORCH_SPEC)" --index-url $(TORCH_INDEX)
	$(BIN)/python -m pytest -q -rs -m torch

# Builds the image and runs docker-compose.yml for real; skips (with the reason) without a Docker daemon.
test-containers: $(STAMP)
	$(BIN)/python -m pytest -q -rs -s -m containers

# Training and serving across Linux network namespaces (root); skips (with the reason) otherwise.
test-netns: $(STAMP)
	$(BIN)/python -m pytest -q -rs -m netns

# `zmqflow status --web` in a real headless browser: Debian's chromium and chromium-driver (apt-get, as root)
# and Selenium into .venv (not in the lock, like PyTorch) when absent; skips (with the reason) without them.
test-browser: $(STAMP)
	@test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || (apt-get update -q && apt-get install -y chromium chromium-driver)
	$(BIN)/python -c "import selenium" 2>/dev/null || $(BIN)/pip install --quiet selenium
	$(BIN)/python -m pytest -q -rs -s -m browser

# Every script in examples/, each printing its final metric; stops at the first that fails.
examples: $(STAMP)
	@set -e; for example in examples/*.py; do echo "== $$example"; $(BIN)/python $$example; done

demo: $(STAMP)
	$(BIN)/zmqflow demo

bench: $(STAMP)
	$(BIN)/zmqflow bench broker --json

clean:
	rm -rf $(VENV) build *.egg-info
