"""Engine-neutral helpers of the real-engine tests (tests/vllm, tests/sglang): the tiny checkpoint, one engine run
in its own process, a real `gatherwise sidecar` process, HTTP calls, every rank's ring records, Prometheus
samples."""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from gatherwise.child_process import stop_child
from tests._repo import ROOT

if TYPE_CHECKING:
    import pytest

    from gatherwise.sidecar.control.block_client import ControlClient

CHECKPOINT_TIMEOUT_S = 300
SIDECAR_STOP_TIMEOUT_S = 20
LOG_TAIL_CHARS = 8000  # of a failed engine run's output, in the assertion message
# "ValueError: ...", "(Worker_TP0 pid=1) RuntimeError: ...", and engine log lines at level ERROR
ERROR_LINE = re.compile(r"^(\(\w+ pid=\d+\) )?([\w.]*(Error|Exception)\b.*:|.*\bERROR\b)")


def build_model(out_dir: str, tokenizer: bool = False) -> str:
    """The tiny random Llama the engine tests load (scripts/tiny_checkpoint.py --for-engines), with the small BPE
    tokenizer and its vocabulary when asked (what structured outputs need)."""
    subprocess.run([sys.executable, str(ROOT / "scripts" / "tiny_checkpoint.py"), out_dir, "--for-engines",
                    *(["--tokenizer"] if tokenizer else [])], check=True, capture_output=True,
                   timeout=CHECKPOINT_TIMEOUT_S)
    return out_dir


def tiny_model(env_variable: str, tmp_path_factory: pytest.TempPathFactory, tokenizer: bool = False) -> str:
    """The checkpoint named by `env_variable` (the make targets build one per run), else one built here."""
    given = os.environ.get(env_variable)
    return given if given else build_model(str(tmp_path_factory.mktemp("tiny-llama")), tokenizer)


def engine_tests_required(ci_variable: str) -> bool:
    """In CI with `ci_variable`=1 (what .ci/run sets for the engine's make target) the engine's tests must run."""
    in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    return in_ci and os.environ.get(ci_variable) == "1"


def require_engine(problem: str | None, ci_variable: str) -> None:
    """Skip the engine's test directory when the engine is not usable here (`problem` says why), except where
    engine_tests_required(ci_variable): there it is a failure."""
    if problem is None:
        return
    import pytest

    if engine_tests_required(ci_variable):
        pytest.fail(f"{problem}; with CI=true and {ci_variable}=1 that is a failure", pytrace=False)
    pytest.skip(problem)


def engine_run_arguments() -> argparse.ArgumentParser:
    """What every `engine_run` module takes: the checkpoint, and optionally the shm_dir and a sidecar to use."""
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--shm-dir")
    p.add_argument("--sidecar")
    p.add_argument("--token")
    return p


def shm_files(patterns: tuple[str, ...]) -> set[str]:
    return {path for pattern in patterns for path in glob.glob(f"/dev/shm/{pattern}")}


def remove_new_shm_files(patterns: tuple[str, ...], before: set[str]) -> None:
    """Remove the /dev/shm files matching `patterns` that were not there `before` (engines kill their own workers
    at shutdown, before those unlink what they created)."""
    for leftover in shm_files(patterns) - before:
        try:
            os.unlink(leftover)
        except OSError:
            pass


def run_engine_process(module: str, model: str, env: dict[str, str], args: tuple[str, ...], *, timeout_s: float,
                       shm_leftovers: tuple[str, ...]) -> dict:
    """`python -m module --model MODEL ARGS` from the repository root; returns the JSON object of its last
    "RESULT " line, with the process's log under "log". Removes the /dev/shm files matching `shm_leftovers` that
    the run left."""
    before = shm_files(shm_leftovers)
    try:
        proc = subprocess.run([sys.executable, "-m", module, "--model", model, *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout_s)
    finally:
        remove_new_shm_files(shm_leftovers, before)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        output = proc.stdout + proc.stderr
        # An engine's workers die first and its front end's cleanup tracebacks come last: name every error line
        # too, so the root cause shows even when the tail holds only the aftermath.
        errors = list(dict.fromkeys(line.strip() for line in output.splitlines() if ERROR_LINE.match(line.strip())))
        raise AssertionError(f"engine run {args} failed (rc {proc.returncode}); error lines:\n"
                             + "\n".join(errors[:40]) + f"\n--- last output:\n{output[-LOG_TAIL_CHARS:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    result["log"] = proc.stderr
    return result


def http(method: str, url: str, body: dict | None = None, token: str | None = None) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any GATHERWISE_* variable, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATHERWISE_")}
    env.update(extra)
    return env


@dataclass
class Sidecar:
    url: str
    token: str
    proc: subprocess.Popen

    def stop(self) -> None:
        stop_child(self.proc, SIDECAR_STOP_TIMEOUT_S)


def start_sidecar(shm_dir: str, env: dict[str, str] | None = None) -> Sidecar:
    """`gatherwise sidecar` on 127.0.0.1, a free port, reading `shm_dir`; mutations need a fresh token."""
    token = secrets.token_hex(16)
    exe = Path(sys.executable).parent / "gatherwise"
    out = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([str(exe), "sidecar", "--host", "127.0.0.1", "--port", "0", "--shm-dir", shm_dir,
                             "--log-level", "warning"], env=dict(env or clean_env(), GATHERWISE_API_TOKEN=token),
                            stdout=out, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out.seek(0)
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", out.read())
        if found:
            return Sidecar(found.group(1), token, proc)
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    out.seek(0)
    raise AssertionError(f"the sidecar did not start:\n{out.read()[-3000:]}")


def run_next_to_sidecar(run_engine: Callable[..., dict], model: str, shm_dir: str, env: dict[str, str]) -> dict:
    """One engine run in `shm_dir` next to a real sidecar reading it; the run gets the sidecar's URL and token."""
    sidecar = start_sidecar(shm_dir)
    try:
        return run_engine(model, env, "--shm-dir", shm_dir, "--sidecar", sidecar.url, "--token", sidecar.token)
    finally:
        sidecar.stop()


class RankRing(TypedDict):
    """One rank's ring records as read_rings returns them."""

    missed: int
    calls: list[list[int]]  # [call_index, mode, rows, collective_ns] each


def read_rings(shm_dir: str, settle_s: float = 20.0) -> dict[str, RankRing]:
    """Every rank's ring records of the one engine in `shm_dir`: {rank: {"missed": n, "calls": [[call_index,
    mode, rows, collective_ns], ...]}}. The reply comes from rank 0; the other ranks may still be writing the
    record of the last call, so read until every ring reached the same last call (or settle_s passed)."""
    from gatherwise.sidecar.ingest.ring_reader import RingReader, discover_engines

    engines = discover_engines(shm_dir)
    if not engines:
        return {}
    readers = {str(rank): RingReader(path) for rank, path in sorted(engines[0].rings.items())}
    rings: dict[str, RankRing] = {rank: {"missed": 0, "calls": []} for rank in readers}
    deadline = time.monotonic() + settle_s
    while True:
        for rank, reader in readers.items():
            records, missed = reader.read_new()
            rings[rank]["missed"] += missed
            rings[rank]["calls"] += [[r.call_index, int(r.mode), r.rows, r.collective_ns] for r in records]
        last = {r["calls"][-1][0] if r["calls"] else -1 for r in rings.values()}
        if len(last) == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for reader in readers.values():
        reader.close()
    return rings


def assert_ranks_ran_the_same_calls(rings: dict, tp: int = 2) -> None:
    """Every rank of a TP=`tp` run (read_rings' result) recorded every call, with the same call indices 0..n-1 and
    the same (mode, rows) for each: no rank ever ran a call in another mode."""
    assert sorted(rings, key=int) == [str(r) for r in range(tp)]
    assert all(r["missed"] == 0 for r in rings.values())
    per_rank = {rank: {c[0]: (c[1], c[2]) for c in r["calls"]} for rank, r in rings.items()}
    assert per_rank["0"] and all(calls == per_rank["0"] for calls in per_rank.values())  # same (mode, rows)
    assert sorted(per_rank["0"]) == list(range(len(per_rank["0"])))


def mode_runs(calls: list[list[int]]) -> list[int]:
    """The modes of a ring's calls in call order, with repeats collapsed: [0, 0, 1, 1, 0] -> [0, 1, 0]."""
    runs: list[int] = []
    for _, mode, *_ in sorted(calls):
        if not runs or runs[-1] != mode:
            runs.append(mode)
    return runs


def metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample of `name` in Prometheus text format."""
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels_text, value = line[len(name) + 1:].rsplit("} ", 1)
            labels = dict(re.findall(r'(\w+)="([^"]*)"', labels_text))
            out.append((labels, float(value)))
    return out


class Control:
    """The engine's control block (absent for the plain engine), and where rank 0's calls stand."""

    def __init__(self, shm_dir: str | None) -> None:
        self.shm_dir = shm_dir
        self.client: ControlClient | None = None

    def _client(self):
        if self.client is None and self.shm_dir:
            from gatherwise.sidecar.control.block_client import ControlClient
            from gatherwise.sidecar.ingest.ring_reader import discover_engines

            engines = discover_engines(self.shm_dir)
            if engines and engines[0].control is not None:  # the hooks install at the first hooked call
                self.client = ControlClient(engines[0].control)
        return self.client

    def set(self, mode: str) -> bool:
        from gatherwise.modes import Mode, ModeTable

        client = self._client()
        if client is None:
            return False
        client.write_command(ModeTable.uniform(Mode.parse(mode)))
        return True

    def call_index(self) -> int | None:
        client = self._client()
        return None if client is None else client.heartbeat().call_index
