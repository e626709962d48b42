"""The GPU check: what must hold (and what it costs) when the logits path runs on CUDA.

    scripts/gpu_check.sh OUTDIR                 # lays out the package tree, then runs this module
    scripts/gpu_check.sh OUTDIR --cpu           # the same checks on the CPU (what `make test` runs; no GPU parts)
    python -m tests.machine.gpu_checks --list   # the checks, in the order they run

Needs torch (with CUDA for the real check), pyyaml and, for the metrics part, prometheus-client; nothing else,
no network, no install, no pytest. Writes OUTDIR/gpu_check.json (every number) and OUTDIR/summary.txt (one line per
check). Each check is independent: a failure is recorded with its message and the next check runs. A global
deadline keeps the run under 8 minutes (checks that would start past it are recorded as skipped). The checks run
every mode in gatherwise.modes.IMPLEMENTED, so a new mode is covered without changing this file.

A run passes when every check passed or was skipped for a stated reason, and at least one passed: a run that
checked nothing (every check skipped, the budget spent before the first) is a failure, never an empty success
(tests.machine.harness). Part of the checkout, not of the installed package: it runs from a plain checkout on
machines with no install.
"""

from __future__ import annotations

import functools
import importlib
import os
import platform
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.machine import harness
from tests.machine.harness import Budget, Checks, Skip

BUDGET_S = 450.0  # the whole run stays under 8 minutes with margin for process start and imports
SAMPLER_ROWS = (1, 64, 256)
SAMPLER_VOCAB = 152064
KINDS = ("greedy", "temperature", "top_k", "top_p")
CHECKS = Checks()  # each check registers itself below, in the order a run takes them


# -- helpers ---------------------------------------------------------------------------------------------
def _params(kind: str) -> Any:
    from gatherwise.engine_hooks.sampling import SamplingParams

    return {"greedy": SamplingParams(), "temperature": SamplingParams(temperature=0.8, seed=1),
            "top_k": SamplingParams(temperature=0.8, top_k=20, seed=1),
            "top_p": SamplingParams(temperature=0.8, top_p=0.9, seed=1)}[kind]


def _rows(kind: str, batch: int, position: int = 0) -> list[Any]:
    from gatherwise.engine_hooks.sampling import SamplingRow

    return [SamplingRow(_params(kind), request_id=i, position=position) for i in range(batch)]


def _other_mode(mode, modes=None):
    from gatherwise.modes import IMPLEMENTED

    modes = IMPLEMENTED if modes is None else modes
    return modes[(modes.index(mode) + 1) % len(modes)]


def _sync(device: Any) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _path(device: Any, vocab: int, mode: Any, *, dtype: Any = None, recorder: Any = None, clock: Any = None,
          source: Any = None, comm: Any = None) -> Any:
    import torch

    from gatherwise.engine_hooks.comm import SingleRankCommunicator
    from gatherwise.engine_hooks.logged_path import LoggedLogitsPath
    from gatherwise.modes import ModeTable

    kw = {"clock": clock} if clock is not None else {}
    return LoggedLogitsPath(comm or SingleRankCommunicator(), vocab, dtype=dtype or torch.bfloat16, device=device,
                            initial_table=ModeTable.uniform(mode), table_source=source, recorder=recorder, **kw)


def _recording(device: Any, path_dir: str, name: str, vocab: int, dtype: Any) -> Any:
    """(clock, recorder, ring) for a path on `device`: CUDA events + resolver on CUDA, perf_counter on CPU."""
    import torch

    from gatherwise.engine_hooks.cuda_timing import cuda_recording
    from gatherwise.engine_hooks.recorder import RingRecorder

    ring = RingRecorder(os.path.join(path_dir, name), engine_id=1, rank=0, tp_size=1, vocab=vocab, dtype=dtype,
                        capacity=4096)
    if torch.device(device).type == "cuda":
        clock, recorder = cuda_recording(ring)
        return clock, recorder, ring
    return time.perf_counter_ns, ring, ring


class _SyncDebug:
    """torch.cuda.set_sync_debug_mode("error") for the block (CUDA only; a no-op on the CPU)."""

    def __init__(self, device: Any) -> None:
        import torch

        self.on = torch.device(device).type == "cuda"

    def __enter__(self) -> None:
        if self.on:
            import torch

            torch.cuda.set_sync_debug_mode("error")

    def __exit__(self, *exc: object) -> None:
        if self.on:
            import torch

            torch.cuda.set_sync_debug_mode(0)


def _fill(path: Any, logits: Any) -> None:
    """The LM head's write: this rank's columns of `logits` [B, V] into the path's buffer (TP=1: all)."""
    buf = path.logits_buffer(logits.shape[0])
    cols = min(path.width, logits.shape[1] - path.rank * path.width)
    buf[:, :cols] = logits[:, path.rank * path.width: path.rank * path.width + cols]


# -- checks ----------------------------------------------------------------------------------------------
SYNCS_BY_DESIGN = {"top_p": "the coverage decision: does each row's nucleus lie among the candidates (else the "
                              "full-row fallback, whose size the host must know)"}


def _sync_free_summary(result: dict) -> str | None:
    return "sync in: " + ", ".join(result["failed"]) if result.get("failed") else None


@CHECKS.check("sync_free", summary=_sync_free_summary)
def check_sync_free(ctx: dict) -> dict:
    """No call of the TP=1 path synchronizes the host, in every mode and sampling kind, across a mode switch.

    Steady state (after warm-up calls) under sync debug "error": no call may synchronize the host, in every
    mode and sampling kind, with a mode switch — except the kinds in SYNCS_BY_DESIGN, which are run and reported
    (synchronizes or not) without failing the check."""
    import torch

    from gatherwise.engine_hooks.table_source import InProcessTableSource
    from gatherwise.modes import IMPLEMENTED

    device, vocab, batch = ctx["device"], 32000, 4
    warm, calls = (3, 8) if ctx["cpu"] else (6, 24)
    out: dict[str, Any] = {"vocab": vocab, "rows": batch, "warmup_calls": warm, "checked_calls": calls, "runs": {},
                           "syncs_by_design": SYNCS_BY_DESIGN}
    failed = []
    gen = torch.Generator(device="cpu").manual_seed(0)
    for mode in IMPLEMENTED:
        for kind in KINDS:
            key = f"{mode.label}/{kind}"
            source = InProcessTableSource()
            clock, recorder, ring = _recording(device, ctx["tmp"], f"sync-{mode.label}-{kind}", vocab, "bfloat16")
            path = _path(device, vocab, mode, recorder=recorder, clock=clock, source=source)
            logits = [torch.randn(batch, vocab, generator=gen).to(device, torch.bfloat16) for _ in range(4)]
            request_at = warm + 3
            run: dict[str, Any] = {}
            try:
                for i in range(warm):
                    _fill(path, logits[i % 4])
                    path.run(_rows(kind, batch, i))
                _sync(device)
                tokens = []
                with _SyncDebug(device):
                    for i in range(warm, warm + calls):
                        if i == request_at:
                            source.request(path.table.uniform(_other_mode(mode)))
                        _fill(path, logits[i % 4])
                        tokens.append(path.run(_rows(kind, batch, i)))
                _sync(device)
                modes = [m.label for m in path.mode_log]
                switch = request_at + 2
                want = [mode.label] * switch + [_other_mode(mode).label] * (warm + calls - switch)
                run.update(status="pass" if modes == want else "fail", switch_call=switch,
                           applied=[(s.seq, s.apply_call) for s in source.applied],
                           tokens_in_range=bool(all(int(t.max()) < vocab for t in tokens)),
                           adopt_waits=path.adopt_waits)
                if kind == "greedy":
                    ref = [logits[i % 4].float().argmax(-1).tolist() for i in range(warm, warm + calls)]
                    run["greedy_matches_argmax"] = [t.tolist() for t in tokens] == ref
                    if not run["greedy_matches_argmax"]:
                        run["status"] = "fail"
            except RuntimeError as exc:  # a synchronizing op under sync debug "error"
                message = str(exc).splitlines()[0][:300]
                if kind in SYNCS_BY_DESIGN and "synchroniz" in message:
                    run.update(status="pass", synchronizes=True, why=SYNCS_BY_DESIGN[kind])
                else:
                    run.update(status="fail", error=message, where=_innermost_frames(exc))
            finally:
                close = getattr(recorder, "close", None)
                if close is not None:
                    close()
                ring.close(unlink=True)
            if run["status"] != "pass":
                failed.append(key)
            out["runs"][key] = run
    out["status"] = "pass" if not failed else "fail"
    out["failed"] = failed
    if ctx["cpu"]:
        out["note"] = "CPU: sync debug mode does not apply; the same code ran and switched at the same call"
    return out


def _innermost_frames(exc: BaseException, count: int = 4) -> list[str]:
    """Where a synchronizing op was called: the innermost frames inside this repository."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "site-packages" not in f.filename]
    return [f"{Path(f.filename).name}:{f.lineno} {f.line}" for f in frames[-count:]]


def _tp2_rank(rank: int, world: int, device: str, vocab: int, batch: int) -> dict:
    import torch

    from gatherwise.engine_hooks.comm import TorchDistCommunicator
    from gatherwise.engine_hooks.table_source import InProcessTableSource
    from gatherwise.modes import IMPLEMENTED

    out: dict[str, dict[str, Any]] = {}  # mode -> its tokens, modes and reference, or its error
    gen = torch.Generator().manual_seed(7)
    logits = [torch.randn(batch, vocab, generator=gen) for _ in range(6)]
    for mode in IMPLEMENTED:
        try:
            source = InProcessTableSource() if rank == 0 else None
            path = _path(device, vocab, mode, dtype=torch.float32, source=source, comm=TorchDistCommunicator())
            tokens = []
            for i, full in enumerate(logits):
                if i == 1 and source is not None:
                    source.request(path.table.uniform(_other_mode(mode)))
                _fill(path, full.to(device))
                tokens.append(path.run(_rows("greedy", batch, i)).tolist())
            out[mode.label] = {"tokens": tokens, "modes": [m.label for m in path.mode_log],
                               "reference": [full.argmax(-1).tolist() for full in logits]}
        except Exception as exc:  # recorded per mode: gloo may not take CUDA tensors
            out[mode.label] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    out["sharded_winners"] = _tp2_winners(device, vocab, logits)
    return out


def _tp2_winners(device: str, vocab: int, logits: list) -> dict:
    """What vLLM Model Runner V2's keyed sharding adds (gatherwise.engine_hooks.adapters.vllm.v2_keyed): each rank's
    winner per row, here its shard's argmax, exchanged by LogitsPath.run_winners. vLLM's Gumbel kernel itself needs
    vLLM's CUDA wheel, which a lent device does not have."""
    import torch

    from gatherwise.engine_hooks.comm import TorchDistCommunicator
    from gatherwise.modes import Mode

    try:
        path = _path(device, vocab, Mode.SHARDED, dtype=torch.float32, comm=TorchDistCommunicator())
        first = path.rank * path.width
        tokens = []
        for host in logits:
            full = host.to(device)
            path.logits_buffer(full.shape[0])
            path.begin_call(full.shape[0])
            shard = full[:, first:first + path.width]
            local = shard.argmax(dim=1)
            tokens.append(path.run_winners(shard.gather(1, local[:, None]).squeeze(1), local + first, 0, t_start=0,
                                           sample_start=0, sample_end=0).tolist())
        return {"tokens": tokens, "modes": [m.label for m in path.mode_log],
                "reference": [full.argmax(-1).tolist() for full in logits]}
    except Exception as exc:  # gloo may not take CUDA tensors
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}


def _tp2_summary(result: dict) -> str | None:
    if "modes" not in result:
        return None
    why = harness.reason(result)
    return "; ".join(f"{m}: {v['status']}" for m, v in result["modes"].items()) + (f" ({why})" if why else "")


@CHECKS.check("tp2_gloo_cuda", summary=_tp2_summary)
def check_tp2_gloo_cuda(ctx: dict) -> dict:
    """TP=2 on one device: two processes, gloo, CUDA tensors (if this torch's gloo takes them); every mode."""
    from gatherwise.tp_engine.launch import launch

    device, vocab, batch = ctx["device"], 1001, 3
    try:
        results = launch(_tp2_rank, 2, device, vocab, batch, device="cpu", timeout=min(120, ctx["left"]() - 10))
    except Exception as exc:  # reported in the result, never raised
        return {"status": "fail", "error": str(exc)[:600]}
    out: dict[str, Any] = {"device": device, "backend": "gloo", "modes": {}}
    ok = True
    for label in results[0]:
        per_rank = [r[label] for r in results]
        if any("error" in r for r in per_rank):
            out["modes"][label] = {"status": "unsupported", "error": next(r["error"] for r in per_rank if "error" in r)}
            ok = False
            continue
        same = all(r["tokens"] == r["reference"] and r["modes"] == per_rank[0]["modes"] for r in per_rank)
        out["modes"][label] = {"status": "pass" if same else "fail", "modes": per_rank[0]["modes"]}
        ok &= same
    out["status"] = "pass" if ok else "fail"
    if not ok and all(m.get("status") == "unsupported" for m in out["modes"].values()):
        out["status"] = "skip"
        out["reason"] = "this torch's gloo does not run these collectives on CUDA tensors"
    return out


@CHECKS.check("event_timing", summary=lambda result: None if "modes" not in result else "; ".join(
    f"{m}: recorded/wall {v['recorded_over_wall']:.2f}" if v["recorded_over_wall"] else m
    for m, v in result["modes"].items()))
def check_event_timing(ctx: dict) -> dict:
    """Per mode: the recorded path time (CUDA events, resolved later) against synchronized wall time."""
    import torch

    from gatherwise.modes import IMPLEMENTED
    from gatherwise.sidecar.ingest.ring_reader import RingReader

    device, batch = ctx["device"], 64
    vocab, calls = (32000, 12) if ctx["cpu"] else (SAMPLER_VOCAB, 30)
    out: dict[str, Any] = {"vocab": vocab, "rows": batch, "dtype": "bfloat16", "modes": {}}
    logits = torch.randn(batch, vocab).to(device, torch.bfloat16)
    for mode in IMPLEMENTED:
        clock, recorder, ring = _recording(device, ctx["tmp"], f"timing-{mode.label}", vocab, "bfloat16")
        path = _path(device, vocab, mode, recorder=recorder, clock=clock)
        walls = []
        for i in range(calls + 3):
            _fill(path, logits)
            _sync(device)
            t0 = time.perf_counter_ns()
            path.run(_rows("greedy", batch, i))
            _sync(device)
            if i >= 3:
                walls.append(time.perf_counter_ns() - t0)
        flush = getattr(recorder, "flush", None)
        if flush is not None:
            flush(wait_for=lambda event: event.synchronize())
        with RingReader(ring.path) as reader:
            records, missed = reader.read_new()
        ring.close(unlink=True)
        recorded = [r.path_ns for r in records[3:]]
        ratio = statistics.median(recorded) / statistics.median(walls) if recorded else None
        out["modes"][mode.label] = {
            "wall_median_us": statistics.median(walls) / 1e3, "recorded_path_median_us":
            statistics.median(recorded) / 1e3 if recorded else None, "recorded_over_wall": ratio,
            "collective_median_us": statistics.median(r.collective_ns for r in records[3:]) / 1e3 if recorded else None,
            "sample_median_us": statistics.median(r.sample_ns for r in records[3:]) / 1e3 if recorded else None,
            "records": len(records), "missed": missed}
    # events measure device time of the path only; wall adds launch and synchronize: recorded <= wall, near it.
    # On the CPU both are host clocks and a loaded machine stretches the wall: only the plumbing is checked.
    ok = all(m["recorded_over_wall"] is not None and (ctx["cpu"] or 0.2 < m["recorded_over_wall"] <= 1.05)
             for m in out["modes"].values())
    out["status"] = "pass" if ok else "fail"
    return out


@CHECKS.check("graphs", summary=lambda result: None if "starts" not in result else "; ".join(
    f"start {m}: {v['status']}" for m, v in result["starts"].items()))
def check_graphs(ctx: dict) -> dict:
    """Capture + replay of every capturable mode (ModeGraphs) from each start: tokens vs eager, a mode switch."""
    import torch

    if ctx["cpu"]:
        raise Skip("needs CUDA (tests/engine_hooks/test_graphs.py covers the logic on the CPU with a stand-in graph)")
    from gatherwise.engine_hooks.graphs import CAPTURABLE, ModeGraphs  # sharded calls run eagerly, never in a graph
    from gatherwise.engine_hooks.table_source import InProcessTableSource

    device, vocab, steps = ctx["device"], 32000, [1, 8, 8, 1, 8, 1, 1, 8, 8, 1, 8, 1]
    out: dict[str, Any] = {"vocab": vocab, "rows": [1, 8], "starts": {}}
    ok = True
    gen = torch.Generator().manual_seed(3)
    inputs_all = [torch.randn(r, vocab, generator=gen).to(device, torch.bfloat16) for r in steps]
    for first in CAPTURABLE:
        source = InProcessTableSource()
        clock, recorder, ring = _recording(device, ctx["tmp"], f"graphs-{first.label}", vocab, "bfloat16")
        path = _path(device, vocab, first, source=source, recorder=recorder, clock=clock)
        eager = _path(device, vocab, first, source=InProcessTableSource())
        path.reserve(8)
        static_in = {r: torch.zeros(r, vocab, dtype=torch.bfloat16, device=device) for r in (1, 8)}
        graphs = ModeGraphs(path)
        t0 = time.perf_counter()
        # the engine's captured step: LM head write, path
        def step(rows: int, path: Any = path, static_in: Any = static_in) -> Any:
            _fill(path, static_in[rows])
            return path.run(_rows("greedy", rows))

        for mode in CAPTURABLE:
            for r in static_in:
                graphs.capture(mode, r, functools.partial(step, r))
        capture_s = time.perf_counter() - t0
        tokens, ref, host_ns = [], [], []
        try:
            with _SyncDebug(device):
                for i, r in enumerate(steps):
                    if i == 3:
                        source.request(path.table.uniform(_other_mode(first, CAPTURABLE)))
                        eager.table_source.request(path.table.uniform(_other_mode(first, CAPTURABLE)))
                    static_in[r].copy_(inputs_all[i])
                    t = time.perf_counter_ns()
                    mode, out_tokens = graphs.replay(r)
                    host_ns.append(time.perf_counter_ns() - t)
                    tokens.append(out_tokens.clone())
                    _fill(eager, inputs_all[i])
                    ref.append(eager.run(_rows("greedy", r)))
            same = [t.tolist() for t in tokens] == [t.tolist() for t in ref]
            modes_ok = [m.label for m in path.mode_log] == [m.label for m in eager.mode_log]
            recorder.flush(wait_for=lambda event: event.synchronize())
            recorded = ring.write_index == len(steps)  # every replayed call timed by events around the replay
            out["starts"][first.label] = {"status": "pass" if same and modes_ok and recorded else "fail",
                                          "tokens_match_eager": same, "records": ring.write_index,
                                          "modes": [m.label for m in path.mode_log], "capture_s": capture_s,
                                          "replay_host_median_us": statistics.median(host_ns) / 1e3}
            ok &= same and modes_ok and recorded
        except RuntimeError as exc:
            out["starts"][first.label] = {"status": "fail", "error": str(exc).splitlines()[0][:300]}
            ok = False
        finally:
            recorder.close()
            ring.close(unlink=True)
    out["status"] = "pass" if ok else "fail"
    return out


def _cuda_time_us(device: Any, fn: Callable[[], Any], reps: int) -> float:
    """Median µs per call: CUDA events on the GPU, perf_counter (synchronized) on the CPU."""
    import torch

    times = []
    for _ in range(reps):
        if torch.device(device).type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        else:
            t = time.perf_counter_ns()
            fn()
            times.append((time.perf_counter_ns() - t) / 1e3)
    return statistics.median(times)


@CHECKS.check("sampler", summary=lambda result: None if "path_us" not in result else "; ".join(
    f"{k} {v:.0f} µs" for k, v in result["path_us"].items() if k.endswith("B256")))
def check_sampler(ctx: dict) -> dict:
    """The path's sampling per mode and kind, B in {1, 64, 256}, V = 152064, bfloat16; the sampler alone.

    Per mode, B, kind: the path call as that mode runs it (collective + that mode's sampling) at TP=1, and
    the shared sampler alone on the received [P, B, V/P] layout for P = 1 and 8."""
    import torch

    from gatherwise.engine_hooks.sampling import sample
    from gatherwise.modes import IMPLEMENTED

    # On the CPU (the plumbing test in make test) a smaller vocab: the GPU shapes would take minutes there.
    device, vocab = ctx["device"], 32000 if ctx["cpu"] else SAMPLER_VOCAB
    reps, kinds = (1, ("greedy", "temperature")) if ctx["cpu"] else (20, KINDS)
    out: dict[str, Any] = {"vocab": vocab, "dtype": "bfloat16", "path_us": {}, "sample_only_us": {}}
    for batch in SAMPLER_ROWS:
        logits = torch.randn(batch, vocab).to(device, torch.bfloat16)
        for mode in IMPLEMENTED:
            path = _path(device, vocab, mode)
            for kind in kinds:
                if ctx["left"]() < 60:
                    out["truncated"] = "stopped early to stay within the time budget"
                    break
                rows = _rows(kind, batch)

                def call(path=path, rows=rows, logits=logits):
                    _fill(path, logits)
                    path.run(rows)

                call()
                out["path_us"][f"{mode.label}/{kind}/B{batch}"] = _cuda_time_us(device, call, reps)
        for p in (1, 8):
            width = -(-vocab // p)
            padded = torch.full((batch, p * width), float("-inf"), dtype=torch.bfloat16, device=device)
            padded[:, :vocab] = logits
            shards = padded.view(batch, p, width).permute(1, 0, 2).contiguous()  # what a rank receives
            for kind in kinds:
                rows = _rows(kind, batch)
                out["sample_only_us"][f"P{p}/{kind}/B{batch}"] = _cuda_time_us(
                    device, functools.partial(sample, shards, vocab, rows), reps)
    out["status"] = "pass"
    return out


@CHECKS.check("hook_overhead", summary=lambda result: None if "modes" not in result else "; ".join(
    f"{m}: off {v['off_us']:.1f} µs, on {v['on_us']:.1f} µs, +{v['added_us']:.2f} µs"
    for m, v in result["modes"].items()))
def check_hook_overhead(ctx: dict) -> dict:
    """Host µs per TP=1 path call, recording off vs on, interleaved blocks; per-call host time (no sync)."""
    import torch

    from gatherwise.modes import IMPLEMENTED

    device, vocab = ctx["device"], 32000
    blocks, block = (10, 50) if ctx["cpu"] else (40, 100)
    out: dict[str, Any] = {"vocab": vocab, "rows": 1, "dtype": "bfloat16", "modes": {}}
    logits = torch.randn(1, vocab).to(device, torch.bfloat16)
    rows = _rows("greedy", 1)
    for mode in IMPLEMENTED:
        clock, recorder, ring = _recording(device, ctx["tmp"], f"overhead-{mode.label}", vocab, "bfloat16")
        paths = {"off": _path(device, vocab, mode), "on": _path(device, vocab, mode, recorder=recorder, clock=clock)}
        times: dict[str, list[int]] = {k: [] for k in paths}
        for b in range(blocks + 2):
            for name in (("off", "on") if b % 2 else ("on", "off")):
                path = paths[name]
                for _ in range(block):
                    t = time.perf_counter_ns()
                    _fill(path, logits)
                    path.run(rows)
                    if b >= 2:
                        times[name].append(time.perf_counter_ns() - t)
                _sync(device)  # keep the device from falling far behind the host between blocks
        close = getattr(recorder, "close", None)
        if close is not None:
            close()
        ring.close(unlink=True)
        med = {k: statistics.median(v) / 1e3 for k, v in times.items()}
        out["modes"][mode.label] = {"off_us": med["off"], "on_us": med["on"], "added_us": med["on"] - med["off"],
                                    "calls_per_variant": len(times["on"])}
    out["compiled_writer"] = _compiled_writer()
    out["status"] = "pass"
    return out


def _host_us(fn: Callable[[], Any], reps: int = 2000) -> float:
    """Median host µs of fn() over reps calls (batches of 10 calls per timing, so the clock read is amortized)."""
    times = []
    for _ in range(reps // 10):
        t = time.perf_counter_ns()
        for _ in range(10):
            fn()
        times.append((time.perf_counter_ns() - t) / 10)
    return statistics.median(times) / 1e3


@CHECKS.check("event_costs", summary=lambda result: None if "host_us" not in result else "; ".join(
    f"{k} {v:.2f}" for k, v in result["host_us"].items()) + " (µs)")
def check_event_costs(ctx: dict) -> dict:
    """Where recording's host time goes on CUDA: each piece the event clock and resolver use, alone."""
    import torch

    if ctx["cpu"]:
        raise Skip("needs CUDA (the CPU path records with perf_counter_ns; lab.hook_overhead)")
    from gatherwise.engine_hooks.call_marks import CallMarks
    from gatherwise.engine_hooks.cuda_timing import CurrentStream, EventClock, EventResolver
    from gatherwise.engine_hooks.recorder import RingRecorder

    device = torch.device(ctx["device"])
    x = torch.zeros(1, device=device)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    for e in ev:
        e.record()
    torch.cuda.synchronize(device)
    stream, cached = torch.cuda.current_stream(), CurrentStream()
    ring = RingRecorder(os.path.join(ctx["tmp"], "event-costs"), engine_id=1, rank=0, tp_size=1, vocab=32000,
                        dtype="bfloat16", capacity=4096)
    marks = CallMarks(1, 0, 1, 0, 64, 10, 20, 30, 0, 0, 30, 40, 50)
    costs = {
        "perf_counter_ns": _host_us(time.perf_counter_ns),
        "tiny_kernel_launch": _host_us(lambda: x.add_(1)),
        "torch.cuda.current_stream()": _host_us(torch.cuda.current_stream),
        "CurrentStream() (cached)": _host_us(cached),
        "Event.record()": _host_us(ev[0].record),
        "Event.record(stream)": _host_us(lambda: ev[0].record(stream)),
        "Event.query() (completed)": _host_us(ev[1].query),
        "Event.elapsed_time()": _host_us(lambda: ev[0].elapsed_time(ev[1])),
        "RingRecorder.record (ring writer)": _host_us(lambda: ring.record(marks)),
        "RingRecorder.count": _host_us(lambda: ring.count(marks)),
        "RingRecorder.record_timed": _host_us(lambda: ring.record_timed(marks)),
    }
    torch.cuda.synchronize(device)
    clock = EventClock(current_stream=CurrentStream())
    resolver = EventResolver(clock, ring, max_pending=1 << 20)

    def one_call() -> None:  # an all_gather call's five marks and its record; resolved on later calls
        t0, c0 = clock(), clock()
        c1, s1, t1 = clock(), clock(), clock()
        resolver.record(CallMarks(1, 0, 1, 0, 64, t0, c0, c1, 0, 0, c1, s1, t1))

    costs["EventClock() mark"] = _host_us(clock, 500)
    clock.release_through(clock._next)  # the marks above were never recorded as calls
    costs["all_gather call: 5 marks + record + poll"] = _host_us(one_call, 1000)
    torch.cuda.synchronize(device)
    resolver.close()
    ring.close(unlink=True)
    return {"status": "pass", "host_us": {k: round(v, 3) for k, v in costs.items()}}


def _compiled_writer() -> bool:
    try:
        importlib.import_module("gatherwise.engine_hooks._ring_writer")  # compiled when pip install had a compiler
    except ImportError:
        return False
    return True


@CHECKS.check("header_metrics")
def check_header_metrics(ctx: dict) -> dict:
    """A ring written through the CUDA timing path, exported by the sidecar's metrics module."""
    try:
        from gatherwise.sidecar.metrics.exposition import SidecarMetrics
        from gatherwise.sidecar.metrics.header_counters import EngineCounters, HeaderCountersCollector, rank_counters
        from gatherwise.sidecar.metrics.record_histograms import RecordHistograms
    except ImportError as exc:
        raise Skip(f"sidecar metrics need {exc.name}") from None
    import torch

    from gatherwise.modes import IMPLEMENTED
    from gatherwise.sidecar.ingest.ring_reader import RingReader

    device, vocab, batch = ctx["device"], 32000, 4
    clock, recorder, ring = _recording(device, ctx["tmp"], "metrics", vocab, "bfloat16")
    logits = torch.randn(batch, vocab).to(device, torch.bfloat16)
    calls = 0
    for mode in IMPLEMENTED:
        path = _path(device, vocab, mode, recorder=recorder, clock=clock)
        for i in range(20):
            _fill(path, logits)
            path.run(_rows("greedy", batch, i))
            calls += 1
    _sync(device)
    flush = getattr(recorder, "flush", None)
    if flush is not None:
        flush(wait_for=lambda event: event.synchronize())
    with RingReader(ring.path) as reader:
        header = reader.header()
    ring.close(unlink=True)
    rc = rank_counters(header, 0, {"overwritten": 0, "torn": 0})
    counters = HeaderCountersCollector(lambda: EngineCounters("0000000000000001", True, 0.0, [rc]))
    metrics = SidecarMetrics(RecordHistograms(), [counters])
    body, _ = metrics.exposition(None)
    text = body.decode()
    exported_calls = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                         if line.startswith("gatherwise_calls_total{"))
    has_seconds = "gatherwise_op_seconds_total{" in text
    ok = exported_calls == calls and has_seconds and header.write_index + sum(header.drops.values()) == calls
    return {"status": "pass" if ok else "fail", "calls": calls, "exported_calls": exported_calls,
            "records": header.write_index, "drops": header.drops, "op_seconds_exported": has_seconds}


def _environment(device: str, cpu: bool) -> dict:
    import torch

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "host": platform.node(),
           "cpus": os.cpu_count(), "loadavg": os.getloadavg(), "device": device, "cpu_fallback": cpu,
           "cuda_available": torch.cuda.is_available(), "compiled_record_writer": _compiled_writer()}
    if torch.cuda.is_available() and not cpu:
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   capability=f"{props.major}.{props.minor}", cuda=torch.version.cuda,
                   nccl=".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None)
    return env


def _title(report: dict) -> str:
    env = report["environment"]
    return (f"gatherwise gpu check on {env.get('gpu', 'CPU (fallback)')} — torch {env['torch']}, "
            f"{report['elapsed_s']} s, compiled record writer: {env['compiled_record_writer']}")


def run(outdir: Path, *, cpu: bool, only: list[str] | None = None, budget_s: float = BUDGET_S) -> dict:
    import torch

    if not cpu and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --cpu for the CPU-only parts")
    budget = Budget(budget_s)
    device = "cpu" if cpu else "cuda:0"
    if cpu:
        torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as tmp:
        return harness.run(CHECKS, outdir, report_name="gpu_check", title=_title,
                           environment=functools.partial(_environment, device, cpu),
                           context={"device": device, "cpu": cpu, "tmp": tmp}, budget=budget, only=only)


def main(argv: list[str] | None = None) -> int:
    return harness.main(CHECKS, lambda args, only: run(args.outdir, cpu=args.cpu, only=only, budget_s=args.budget),
                        argv, prog="scripts/gpu_check.sh", description=(__doc__ or "").split("\n")[0],
                        budget_s=BUDGET_S)


if __name__ == "__main__":
    raise SystemExit(main())
