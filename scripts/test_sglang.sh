#!/usr/bin/env bash
# `make test-sglang`: SGLang 0.5.23 in its own venv (.venv-sglang), a tiny Llama checkpoint built locally, then
# tests/sglang/ (SGLang TP=2 on CPU with and without gatherwise).
#
# SGLang's wheel declares the whole CUDA serving stack (flashinfer, flash-attn, deep-ep, tilelang, ...), none of
# which its CPU path imports, so sglang is installed without dependencies and then the packages its offline
# engine does import on CPU, at the versions it pins. torch is SGLang's pinned 2.14.1: PyPI has no CPU build of
# it, and the CPU build of 2.13 cannot load the torchvision SGLang imports. `sgl_kernel` is imported (never
# called) on the CPU path and its wheels are CUDA builds: tests/sglang/stand_in_sgl_kernel is an import-only
# stand-in whose every function raises, installed into this venv only (docs/sglang.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv-sglang
STAMP=$VENV/.installed
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ] || [ engine_hooks/_ring_writer.c -nt "$STAMP" ] || [ "$0" -nt "$STAMP" ]; then
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  PIP=("$VENV/bin/pip" install --quiet)
  "${PIP[@]}" --upgrade pip
  "${PIP[@]}" torch==2.14.1 torchvision==0.29.1
  "${PIP[@]}" --no-deps sglang==0.5.23
  "${PIP[@]}" --no-deps xgrammar==0.2.7 apache-tvm-ffi==0.1.11
  "${PIP[@]}" numpy transformers==5.19.0 tokenizers==0.23.2 safetensors aiohttp fastapi "uvicorn>=0.51" uvloop \
    orjson "pyzmq>=25.1.2" psutil setproctitle requests pydantic packaging pybase64 msgspec "prometheus-client>=0.20" \
    tqdm einops pillow python-multipart interegular partial_json_parser xxhash sentencepiece==0.2.1 tiktoken \
    openai==2.8.0 scipy watchfiles IPython dill gguf compressed-tensors==0.18.0
  # what its OpenAI-compatible server (sglang.launch_server) and its benchmark client (sglang.bench_serving) import
  # as well: `gatherwise bench serve` runs both
  "${PIP[@]}" jsonschema soundfile==0.13.1 datasets
  "${PIP[@]}" ./tests/sglang/stand_in_sgl_kernel
  # the bench extra (matplotlib: `gatherwise bench serve` draws its PNG here); SGLang pins python-dateutil<3
  "${PIP[@]}" -e ".[sidecar,bench,models]" "python-dateutil<3" pytest pytest-timeout
  touch "$STAMP"
fi
[ "${GATHERWISE_SGLANG_INSTALL_ONLY:-0}" = 1 ] && exit 0
MODEL_DIR=$(mktemp -d "${TMPDIR:-/tmp}/gatherwise-tiny-llama.XXXXXX")
trap 'rm -rf "$MODEL_DIR"' EXIT
"$VENV/bin/python" scripts/tiny_checkpoint.py "$MODEL_DIR" --for-engines >/dev/null
export GATHERWISE_SGLANG_MODEL=$MODEL_DIR
# the trained models the tests run (tests/sglang/test_sglang_trained_models.py): fetched once into the user's cache
for name in $(tr , ' ' <<<"${GATHERWISE_TRAINED_MODELS:-smollm2}"); do "$VENV/bin/gatherwise" models fetch "$name" >/dev/null; done
# GATHERWISE_TEST_PATHS: only these test files (make test-models), else every SGLang test
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -rs ${GATHERWISE_TEST_PATHS:-tests/sglang} "$@"
