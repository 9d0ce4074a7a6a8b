# gpulab: JupyterHub + DockerSpawner for GPU notebooks. `make help` lists the targets.
#
# Everything a fresh Debian 12 machine needs is installed by these targets: the virtualenv
# (.venv), configurable-http-proxy from npm (.build/node), a Docker engine (apt docker.io,
# started without systemd) and the notebook images (built offline, see scripts/build-images.sh).
# `make run` is the local trial (set up, then serve); a server installs once (`make prereqs`,
# `make install`) and serves with `make serve` or the systemd unit (docs/install.md).

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON      ?= python3
VENV        := .venv
NODE_DIR    := .build/node
PROXY_BIN   := $(NODE_DIR)/node_modules/.bin
CHP         := $(PROXY_BIN)/configurable-http-proxy
CHP_VERSION ?= 5
# gpulab's data directory (databases, secrets key, passwords, the local store) for `make run`
# and `make doctor`: GPULAB_DATA_DIR from the environment, else data/ in the checkout.
DATA_DIR    := $(abspath $(or $(GPULAB_DATA_DIR),data))

# Port the hub listens on (read by jupyterhub_config.py).
GPULAB_PORT ?= 8000
export GPULAB_PORT
# Extra arguments for pytest, e.g. `make test PYTEST_ARGS='-k spawn -x'`.
PYTEST_ARGS ?=
# pytest-xdist workers for the tests outside the swarm lab (0: one process; scripts/run-tests.sh).
TEST_WORKERS ?= 3
# `make images FORCE=1` rebuilds the images even when they are up to date.
FORCE ?=
# `make images GPU=cuda|cpu`: the framework images' flavour (default: cuda where an NVIDIA
# driver is, else cpu; see docs/images.md).
GPU ?=
# Worker nodes of `make swarm-lab`.
SWARM_WORKERS ?= 2

# PATH for the hub, the tests and the benchmarks: the proxy and the venv's scripts first.
RUN_PATH := $(CURDIR)/$(PROXY_BIN):$(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: help venv proxy engine images browser postgres ldap nginx registry setup run prereqs install serve \
	doctor test lint format \
	bench clean-images clean swarm-lab swarm-lab-down

help: ## Show this help
	@echo "Usage: make TARGET [GPULAB_PORT=8000] [PYTEST_ARGS=...] [FORCE=1] [GPU=cuda|cpu]"
	@echo
	@grep -hE '^[a-zA-Z_.-]+:.*## ' $(MAKEFILE_LIST) \
		| awk 'BEGIN {FS = ":.*## "} {printf "  %-13s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -e '.[test]'
	touch $@

venv: $(VENV)/.installed ## Create .venv and install gpulab with its test extras (again when pyproject.toml changes)

$(CHP):
	@command -v npm >/dev/null 2>&1 || { \
		echo "npm not found: installing Debian's nodejs and npm"; \
		scripts/apt-install.sh nodejs npm; }
	mkdir -p $(NODE_DIR)
	npm install --prefix $(NODE_DIR) --no-audit --no-fund --loglevel=error \
		configurable-http-proxy@$(CHP_VERSION)
	@test -x $@ || { echo "ERROR: npm install did not produce $@" >&2; exit 1; }
	$@ --version

proxy: $(CHP) ## Install configurable-http-proxy (npm) into .build/node

engine: ## Make sure a Docker engine runs (installs docker.io and starts dockerd if needed)
	scripts/ensure-docker.sh

images: engine ## Build the images gpulab/{debian:bookworm,python:3.11,pytorch:2.13,tensorflow:2.20,jax:0.7} and the sync helper gpulab/sync:VERSION when missing or stale: CUDA builds on a host with an NVIDIA driver, else CPU (GPU=cuda|cpu chooses; REGISTRY=host:port also pushes them there)
	scripts/build-images.sh $(if $(FORCE),--force) $(if $(GPU),--gpu $(GPU)) $(if $(REGISTRY),--push $(REGISTRY) debian python pytorch tensorflow jax sync proxy)

browser: ## Install Debian's chromium for the browser tests when /usr/bin/chromium is missing
	@test -x /usr/bin/chromium || { \
		echo "chromium not found: installing Debian's chromium"; \
		scripts/apt-install.sh --log /tmp/gpulab-apt-chromium.log chromium; }
	@test -x /usr/bin/chromium || { echo "ERROR: /usr/bin/chromium is still missing" >&2; exit 1; }

setup: venv proxy engine images browser ## Everything run and test need

run: setup ## Run the hub on port GPULAB_PORT (default 8000; data in GPULAB_DATA_DIR, else data/; a site file: GPULAB_SITE_CONFIG or /etc/gpulab/gpulab_config.py)
	mkdir -p $(DATA_DIR)
	GPULAB_DATA_DIR="$(DATA_DIR)" exec scripts/serve.sh

prereqs: ## On a server: install the system packages gpulab needs (Debian 12 / Ubuntu 24.04, as root; docs/install.md)
	scripts/install-prereqs.sh

install: ## On a server: put gpulab (.venv), its proxy and its images in place, only what is missing (GPU=cuda|cpu; docs/install.md)
	scripts/install.sh $(if $(GPU),--gpu $(GPU))

serve: ## Serve what `make install` put in place, installing nothing (what the systemd unit runs: scripts/serve.sh)
	exec scripts/serve.sh

doctor: venv ## Check what gpulab needs of this host with `make run`'s configuration (gpulab doctor; docs/doctor.md)
	PATH="$(RUN_PATH)" GPULAB_DATA_DIR="$(DATA_DIR)" \
		$(VENV)/bin/gpulab doctor --config jupyterhub_config.py

postgres: ## Make sure a local PostgreSQL server runs (for the tests of gpulab on PostgreSQL)
	scripts/ensure-postgres.sh

ldap: ## Make sure Debian's slapd and ldap-utils are installed (the log-in tests start their own directory)
	scripts/ensure-slapd.sh

nginx: ## Make sure Debian's nginx is installed (the tests of a store behind TLS and of the HTTPS front door start their own)
	scripts/ensure-nginx.sh

registry: ## Make sure Debian's docker-registry is installed (the tests of images pulled from a private registry start their own)
	scripts/ensure-registry.sh

test: setup browser postgres ldap nginx registry ## Lint, then run the test suite (PYTEST_ARGS=... passes arguments to pytest; TEST_WORKERS=3)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench
	PATH="$(RUN_PATH)" scripts/run-tests.sh $(TEST_WORKERS) $(PYTEST_ARGS)

lint: venv ## Check style with ruff (lint + format check)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

format: venv ## Format the code with ruff (and sort imports)
	$(VENV)/bin/ruff check --fix --select I src tests bench
	$(VENV)/bin/ruff format src tests bench

bench: setup ## Run every bench/bench_*.py benchmark
	@set -e; found=0; \
	for f in bench/bench_*.py; do \
		[ -e "$$f" ] || continue; found=1; \
		echo "=== $$f"; \
		PATH="$(RUN_PATH)" $(VENV)/bin/python "$$f"; \
	done; \
	[ $$found = 1 ] || echo "no bench/bench_*.py to run"

swarm-lab: engine ## Start the multi-node Swarm test lab: SWARM_WORKERS=2 DinD workers, a registry (docs/swarm-lab.md)
	scripts/swarm-lab.sh up $(SWARM_WORKERS)

swarm-lab-down: engine ## Remove the Swarm test lab; the host engine leaves the lab's swarm
	scripts/swarm-lab.sh down

clean-images: ## Remove the gpulab images (and the build contexts in .build/ctx)
	-docker rmi $${GPULAB_TENSORFLOW_IMAGE:-gpulab/tensorflow:2.20} $${GPULAB_JAX_IMAGE:-gpulab/jax:0.7} \
		$${GPULAB_PYTORCH_IMAGE:-gpulab/pytorch:2.13} $${GPULAB_PYTHON_IMAGE:-gpulab/python:3.11} \
		$${GPULAB_DEBIAN_IMAGE:-gpulab/debian:bookworm}
	rm -rf .build/ctx

clean: ## Remove .venv, .build (wheel cache, proxy, logs) and caches; keeps data/ and the images
	rm -rf $(VENV) .build .pytest_cache .ruff_cache src/*.egg-info
	find src tests bench -name __pycache__ -type d -prune -exec rm -rf {} + 2>/dev/null || true
