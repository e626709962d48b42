"""The sweep itself, run on every rank: the hooked logits path, modes interleaved, timed per call.

Per (vocab, dtype) there is one LogitsPath per mode on the same process group, each pinned to its mode by a
uniform table. Per (sampling, rows), the logits are random and written once into every path's send buffer;
then each iteration calls every mode once (A B A B ...) so machine drift hits all modes alike. Every row of
a call samples with the same `--sampling` item; its draw moves with the iteration. Warm-up calls are run and
dropped.

Timing (see docs/bench.md): a barrier before every call, then each rank stamps the call's start and end with
time.perf_counter_ns (CLOCK_MONOTONIC, one clock for all processes of a host). The parent takes, per call,
max over ranks of end minus min over ranks of start.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from gatherwise.bench.sampling_spec import parse_sampling
from gatherwise.engine_hooks.call_marks import CallMarks
from gatherwise.engine_hooks.comm import default_communicator
from gatherwise.engine_hooks.logits_path import LogitsPath
from gatherwise.engine_hooks.sampling import SamplingParams, SamplingRow
from gatherwise.engine_hooks.torch_dtypes import TORCH_LOGITS_DTYPES
from gatherwise.modes import Mode, ModeTable
from gatherwise.shm_format.ring import broadcast_bytes
from gatherwise.tp_engine.same_args import check_same_args


@dataclass(frozen=True)
class SweepConfig:
    tp: int
    vocabs: tuple[int, ...]
    rows: tuple[int, ...]
    dtypes: tuple[str, ...]
    modes: tuple[str, ...]
    iters: int
    warmup: int
    device: str = "cpu"  # "cpu" (gloo) or "cuda" (NCCL, rank r on cuda:r)
    seed: int = 0
    samplings: tuple[str, ...] = ("greedy",)  # gatherwise.bench.sampling_spec labels
    logit_scale: float = 1.0

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"


@dataclass
class CallTimes:
    """Measured (post-warm-up) calls of one (vocab, dtype, rows, mode) on one rank; all in ns."""

    start: list[int] = field(default_factory=list)
    end: list[int] = field(default_factory=list)
    collective: list[int] = field(default_factory=list)  # gather or all_gather, as the path recorded it
    sample: list[int] = field(default_factory=list)
    broadcast: list[int] = field(default_factory=list)  # second op: token broadcast or shard_resolve, else 0
    wire_bytes: list[int] = field(default_factory=list)  # bytes this rank's collectives moved (as recorded)
    topp_rows: int = 0
    fallback_rows: int = 0  # top-p rows that took the sharded full-row fallback


ShapeKey = tuple[int, str, str, int, str]  # (vocab, dtype, sampling, rows, mode)


class _PhaseRecorder:
    """Keeps the phase marks of the last call (LogitsPath's CallRecorder protocol)."""

    def __init__(self) -> None:
        self.last = (0, 0, 0, 0, 0, 0)

    def record(self, m: CallMarks, /) -> None:
        second = m.second_end - m.second_start
        second_bytes = m.resolve_nbytes if m.mode == Mode.SHARDED else broadcast_bytes(m.rows) if second else 0
        self.last = (m.coll_end - m.coll_start, m.sample_end - m.sample_start, second, m.nbytes + second_bytes,
                     m.topp_rows, m.fallback_rows)


def sweep_rank(rank: int, world: int, cfg: SweepConfig) -> dict[ShapeKey, CallTimes]:
    """Run the whole sweep on this rank (inside an initialized process group); return its timings."""
    # the launcher set this rank's GPU (a node's i-th rank on cuda:i, whatever its global rank)
    gpu = torch.cuda.current_device() if cfg.device == "cuda" else 0
    device = torch.device("cuda", gpu) if cfg.device == "cuda" else torch.device("cpu")
    comm = default_communicator()
    check_same_args(comm, repr(cfg), device, "bench arguments")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    barrier = (lambda: dist.barrier(device_ids=[gpu])) if device.type == "cuda" else dist.barrier
    if world == 1:
        barrier = lambda: None
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + rank)
    out: dict[ShapeKey, CallTimes] = {}
    t0 = time.perf_counter()
    for vocab in cfg.vocabs:
        for dtype_name in cfg.dtypes:
            recorders = {m: _PhaseRecorder() for m in cfg.modes}
            paths = {m: LogitsPath(comm, vocab, dtype=TORCH_LOGITS_DTYPES[dtype_name], device=device,
                                   initial_table=ModeTable.uniform(Mode.parse(m)), recorder=recorders[m])
                     for m in cfg.modes}
            for sampling, rows in ((s, r) for s in cfg.samplings for r in cfg.rows):
                _fill(paths, rows, gen, cfg.logit_scale)
                times = {m: out.setdefault((vocab, dtype_name, sampling, rows, m), CallTimes()) for m in cfg.modes}
                spec = parse_sampling(sampling)
                params = SamplingParams(spec.temperature, spec.top_k, spec.top_p, seed=cfg.seed)
                for it in range(cfg.warmup + cfg.iters):
                    batch = [SamplingRow(params, request_id=i, position=it) for i in range(rows)]
                    for m in cfg.modes:  # interleaved: A B A B ...
                        path = paths[m]
                        barrier()
                        sync()
                        start = time.perf_counter_ns()
                        path.logits_buffer(rows)  # same storage, already filled: this only re-arms the call
                        path.run(batch)
                        sync()
                        end = time.perf_counter_ns()
                        if it >= cfg.warmup:
                            t = times[m]
                            t.start.append(start)
                            t.end.append(end)
                            coll, samp, bcast, wire, topp, fallback = recorders[m].last
                            t.collective.append(coll)
                            t.sample.append(samp)
                            t.broadcast.append(bcast)
                            t.wire_bytes.append(wire)
                            t.topp_rows += topp
                            t.fallback_rows += fallback
                if rank == 0:
                    print(f"[bench] vocab={vocab} dtype={dtype_name} {sampling} rows={rows} done "
                          f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
            del paths  # free this shape's buffers before the next (vocab, dtype)
    return out


def _fill(paths: dict[str, LogitsPath], rows: int, gen: torch.Generator, scale: float = 1.0) -> None:
    """Random logits, written once per shape into every mode's send buffer (the LM head's job)."""
    first = next(iter(paths.values()))
    logits = torch.randn(rows, first.width, generator=gen) * scale
    for path in paths.values():
        path.logits_buffer(rows).copy_(logits)
