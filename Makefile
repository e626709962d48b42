# gatherwise: `make demo` runs the live demo, `make test` runs the tests. Both set up .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
APT_PACKAGES := prometheus docker-compose chromium

.PHONY: demo models test test-vllm test-sglang test-models test-multinode bench-serve lint typecheck deps apt clean

$(STAMP): pyproject.toml setup.py constraints.txt engine_hooks/_ring_writer.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[sidecar,engine,bench,models,dev]'
	touch $(STAMP)

deps: $(STAMP)

# Debian tools the tests use (promtool/prometheus, docker-compose, chromium for the live page's browser test,
# kubectl for `kubectl kustomize` of deploy/kubernetes/): installed when running as root.
apt:
	@missing=""; command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v docker-compose >/dev/null || missing="$$missing docker-compose"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v kubectl >/dev/null || missing="$$missing kubernetes-client"; \
	command -v ip >/dev/null || missing="$$missing iproute2"; command -v curl >/dev/null || missing="$$missing curl"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  else echo "note: missing$$missing (run as root or install them; their tests skip locally)"; fi; \
	fi

demo: $(STAMP) models
	$(BIN)/gatherwise demo

# The trained model the tests and the demo run (SmolLM2-135M-Instruct): fetched into the user's cache once.
models: $(STAMP)
	$(BIN)/gatherwise models fetch smollm2 >/dev/null

test: $(STAMP) apt models
	$(BIN)/ruff check .
	$(MAKE) --no-print-directory typecheck
	$(BIN)/python -m pytest -q -p no:cacheprovider tests

test-vllm:
	bash scripts/test_vllm.sh

test-sglang:
	bash scripts/test_sglang.sh

# The trained-model matrix (docs/models.md): SmolLM2-135M-Instruct and Gemma-3-270M through the reference engine at
# every TP their heads allow, and through vLLM and SGLang (every round and phase); fetched once into the cache.
test-models: $(STAMP)
	GATHERWISE_TRAINED_MODELS=smollm2,gemma3 GATHERWISE_TRAINED_FULL=1 \
	  $(BIN)/python -m pytest -q -p no:cacheprovider -rs tests/tp_engine/test_trained_models.py
	GATHERWISE_TRAINED_MODELS=smollm2,gemma3 GATHERWISE_TRAINED_FULL=1 \
	  GATHERWISE_TEST_PATHS=tests/vllm/test_vllm_trained_models.py bash scripts/test_vllm.sh
	GATHERWISE_TRAINED_MODELS=smollm2,gemma3 GATHERWISE_TRAINED_FULL=1 \
	  GATHERWISE_TEST_PATHS="tests/sglang/test_sglang_trained_models.py tests/sglang/test_sglang_gatherwise_sampler.py" \
	  bash scripts/test_sglang.sh

# SGLang, vLLM and the reference engine TP=2 across two "nodes" made of network and mount namespaces on this host,
# a sidecar on each node and one Prometheus (root; docs/deployment.md, "Two nodes on one host").
test-multinode: apt $(STAMP)
	GATHERWISE_SGLANG_INSTALL_ONLY=1 bash scripts/test_sglang.sh
	GATHERWISE_VLLM_INSTALL_ONLY=1 bash scripts/test_vllm.sh
	.venv-sglang/bin/python -m tests.machine.two_node --engine sglang --out out/two_node
	.venv-sglang/bin/python -m tests.machine.two_node --engine vllm --out out/two_node
	.venv-sglang/bin/python -m tests.machine.two_node --engine reference --out out/two_node

# The serving benchmark on both engines' own servers and clients, with its defaults (docs/bench_serve.md): about
# an hour per engine on a 2-core host (53 min vLLM, 58 SGLang); each waits for the load average to fall under 3 first.
bench-serve:
	GATHERWISE_VLLM_INSTALL_ONLY=1 bash scripts/test_vllm.sh
	GATHERWISE_SGLANG_INSTALL_ONLY=1 bash scripts/test_sglang.sh
	.venv-vllm/bin/gatherwise bench serve --engine vllm --max-load 3
	.venv-sglang/bin/gatherwise bench serve --engine sglang --max-load 3

lint: $(STAMP)
	$(BIN)/ruff check .

# mypy reads the installed package shape (one `gatherwise` package), laid out from the checkout as symlinks,
# and the checkout's scripts, lab and tests against it; its cache stays in build/.
typecheck: $(STAMP)
	@$(BIN)/python scripts/package_tree.py build/package-tree >/dev/null
	$(BIN)/mypy --cache-dir build/mypy-cache build/package-tree/gatherwise scripts lab tests

clean:
	rm -rf $(VENV) .venv-vllm .venv-sglang .pytest_cache .ruff_cache out build
