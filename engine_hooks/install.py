"""Put the hooks into one TP rank: handshake, engine instance id, ring recorder, control block.

Every rank calls install_hooks() once, after its process group exists and before the first logits call;
adapters (tp_engine, vLLM, SGLang) differ only in the communicator they pass.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from gatherwise import HOOKS_VERSION
from gatherwise.config import GatherwiseConfig, config_hash, load_config
from gatherwise.engine_hooks.comm import Communicator
from gatherwise.engine_hooks.handshake import handshake
from gatherwise.engine_hooks.logged_path import LoggedLogitsPath
from gatherwise.engine_hooks.logits_path import CallRecorder, LogitsPath
from gatherwise.engine_hooks.torch_dtypes import TORCH_LOGITS_DTYPES
from gatherwise.modes import Mode, ModeTable
from gatherwise.shm_format.engine_info import RankRoute
from gatherwise.shm_format.liveness import LivenessLock

log = logging.getLogger("gatherwise.install")
ENGINE_ID_RANDOM_BITS = 63
REFERENCE_ENGINE = "gatherwise reference engine"
# Who samples in each mode when the engine leaves sampling to the logits path (gatherwise.engine_hooks.sampling,
# .sharded_exchange); adapters whose engine samples itself pass their own.
GATHERWISE_SAMPLER = {
    "all_gather": "gatherwise full-row sampler, every rank",
    "gather": "gatherwise full-row sampler on rank 0, tokens broadcast",
    "sharded": "gatherwise sharded sampler (per-shard candidates exchanged)",
}


class Closable(Protocol):
    def close(self) -> None: ...


@dataclass
class InstalledHooks:
    logits_path: LogitsPath
    engine_id: int
    engine_dir: Path | None
    config: GatherwiseConfig
    _closables: list[Closable] = field(default_factory=list)
    liveness: LivenessLock | None = None  # this rank's, released last
    removes_dir: bool = False  # this rank removes engine_dir at close: its node's lowest rank

    def close(self) -> None:
        """Close the ring and control block; the node's lowest rank (rank 0 on a single node) removes the engine's
        shared-memory directory on its node."""
        for item in self._closables:
            item.close()
        self._closables.clear()
        if self.removes_dir and self.engine_dir is not None:
            shutil.rmtree(self.engine_dir, ignore_errors=True)
        if self.liveness is not None:
            self.liveness.close()
            self.liveness = None


def logits_dtype(config: GatherwiseConfig) -> torch.dtype:
    return TORCH_LOGITS_DTYPES[config.engine.logits_dtype]


def initial_table(config: GatherwiseConfig) -> ModeTable:
    if config.engine.initial_table_file:
        from gatherwise.table_file import load_table_file

        return load_table_file(config.engine.initial_table_file)
    return ModeTable.uniform(Mode.parse(config.engine.initial_mode))


def share_engine_id(comm: Communicator, device: torch.device | str) -> int:
    """Rank 0 draws a random instance id (new at every start) and every rank receives it: 63 random bits, so it
    travels as a non-negative int64."""
    word = torch.tensor([secrets.randbits(ENGINE_ID_RANDOM_BITS)], dtype=torch.int64, device=device)
    comm.broadcast(word)
    return int(word.item())


def install_hooks(comm: Communicator, *, vocab: int, dtype: torch.dtype | None = None,
                  device: torch.device | str = "cpu", config: GatherwiseConfig | None = None,
                  table: ModeTable | None = None, keep_log: bool = False, engine_kind: str = REFERENCE_ENGINE,
                  engine_version: str = HOOKS_VERSION, sampler: dict[str, str] | None = None,
                  model: str = "", route: RankRoute | None = None) -> InstalledHooks:
    """`engine_kind`, `engine_version`, `sampler` (mode label -> who samples in it), `model` (what it serves) and
    `route` (the engine's runner and what its fingerprints matched) go into this rank's info file
    (gatherwise/shm_format/engine_info.py), for the sidecar to show."""
    cfg = config if config is not None else load_config(os.environ.get("GATHERWISE_CONFIG"))
    dtype = dtype if dtype is not None else logits_dtype(cfg)
    table = table if table is not None else initial_table(cfg)
    handshake(comm, config_hash=config_hash(cfg), table=table, vocab=vocab, dtype=dtype, device=device)
    engine_id = share_engine_id(comm, device)
    closables: list[Closable] = []
    recorder = source = engine_dir = liveness = None
    # gatherwise never ends a rank: a rank whose files cannot be made (a full or read-only filesystem, a
    # directory made unusable since the launcher checked it) runs without them and says so once.
    if cfg.telemetry.enabled or cfg.control.enabled:
        try:
            engine_dir, liveness = _create_engine_dir(cfg.engine.shm_dir, engine_id, comm.rank)
        except OSError as exc:
            _runs_without("telemetry and control", comm.rank, f"engine.shm_dir {cfg.engine.shm_dir}: {exc}")
    if engine_dir is not None:
        from gatherwise.shm_format.engine_info import write_rank_info

        try:
            write_rank_info(engine_dir, comm.rank, engine_kind, engine_version, sampler or GATHERWISE_SAMPLER, model,
                            route)
        except OSError as exc:  # only what the sidecar shows about the rank is missing
            log.warning("gatherwise: TP rank %d could not write its info file in %s: %s", comm.rank, engine_dir, exc)
    # Rank 0's control block before its ring: a sidecar attaches once every ring exists, and then finds the block.
    if cfg.control.enabled and comm.rank == 0 and engine_dir is not None:
        from gatherwise.engine_hooks.control_block import ControlBlockSource
        from gatherwise.shm_format.control import control_path

        try:
            source = ControlBlockSource(control_path(cfg.engine.shm_dir, engine_id), engine_id=engine_id,
                                        tp_size=comm.world_size, table=table)
            closables.append(source)
        except OSError as exc:
            _runs_without("control", comm.rank, f"cannot create its control block in {engine_dir}: "
                          f"{exc.strerror or exc}")
    if cfg.telemetry.enabled and engine_dir is not None:
        from gatherwise.engine_hooks.recorder import RingRecorder
        from gatherwise.shm_format.ring import ring_file_size, ring_path

        try:
            recorder = RingRecorder(ring_path(cfg.engine.shm_dir, engine_id, comm.rank), engine_id=engine_id,
                                    rank=comm.rank, tp_size=comm.world_size, vocab=vocab, dtype=dtype,
                                    capacity=cfg.telemetry.ring_capacity)
            closables.append(recorder)
        except OSError as exc:
            _runs_without("telemetry", comm.rank, f"cannot reserve the "
                          f"{ring_file_size(cfg.telemetry.ring_capacity)} bytes of its ring in {engine_dir}: "
                          f"{exc.strerror or exc}")
    local = publish_node_ranks(comm, engine_dir, device)  # every file of this rank exists by now
    clock = time.perf_counter_ns
    path_recorder: CallRecorder | None = recorder
    if recorder is not None and torch.device(device).type == "cuda":
        from gatherwise.engine_hooks.cuda_timing import cuda_recording

        # event pairs on the stream, resolved calls later by query(): no synchronize on the hot path
        clock, path_recorder = cuda_recording(recorder)
        closables[closables.index(recorder)] = path_recorder  # closing the resolver flushes, then closes the ring
    if cfg.control.inject_delay:  # fault injection for tests of a slow rank: imported only when asked for
        from gatherwise.engine_hooks.delay_injection import DelayedCommunicator

        comm = DelayedCommunicator(comm, cfg.control.inject_delay)
    path_class = LoggedLogitsPath if keep_log else LogitsPath
    path = path_class(comm, vocab, dtype=dtype, device=device, initial_table=table, table_source=source,
                      recorder=path_recorder, clock=clock)
    removes_dir = comm.rank == (local[0] if local else 0)
    return InstalledHooks(path, engine_id, engine_dir, cfg, closables, liveness, removes_dir)


def publish_node_ranks(comm: Communicator, engine_dir: Path | None, device: torch.device | str) -> tuple[int, ...]:
    """After every rank made its files: which ranks share this rank's engine directory (its node's ranks), and,
    from the node's lowest rank, the node file that says so (gatherwise/shm_format/node_ranks.py). Returns this
    node's ranks (empty without a directory). Two small all_gathers, once per engine start; every rank runs
    them, with or without a directory, so none is left waiting."""
    from gatherwise.shm_format.node_ranks import ranks_in_dir, write_node_ranks

    world = comm.world_size
    barrier = torch.zeros(world, 1, dtype=torch.int64, device=device)
    comm.all_gather(barrier, torch.zeros(1, dtype=torch.int64, device=device))  # every rank's files exist now
    local: tuple[int, ...] = ()
    if engine_dir is not None:
        try:
            local = ranks_in_dir(engine_dir)
        except OSError as exc:
            log.warning("gatherwise: TP rank %d cannot list %s: %s", comm.rank, engine_dir, exc)
    lowest = torch.zeros(world, 1, dtype=torch.int64, device=device)
    comm.all_gather(lowest, torch.tensor([local[0] if local else -1], dtype=torch.int64, device=device))
    leaders = sorted({r for r in lowest.view(-1).cpu().tolist() if r >= 0})  # one per node: its lowest rank
    if engine_dir is not None and local and local[0] == comm.rank:
        try:
            write_node_ranks(engine_dir, world, local, leaders.index(comm.rank), len(leaders))
        except OSError as exc:  # the node's sidecar then attaches only if this node holds every rank
            log.warning("gatherwise: TP rank %d could not write the node file in %s: %s", comm.rank, engine_dir, exc)
    return local


def _runs_without(what: str, rank: int, why: str) -> None:
    log.warning("gatherwise: TP rank %d runs with %s off (the engine itself is unaffected): %s", rank, what, why)


def _create_engine_dir(shm_dir: str, engine_id: int, rank: int) -> tuple[Path, LivenessLock]:
    """`<shm_dir>/<engine id>`, private to this user (see shm_format/private_files.py), with this rank's liveness
    lock in it. Rank 0 first removes the directories of engines that died without removing theirs."""
    from gatherwise.shm_format.liveness import remove_dead_engine_dirs
    from gatherwise.shm_format.private_files import ensure_private_dir
    from gatherwise.shm_format.ring import engine_dir

    ensure_private_dir(shm_dir)  # UnsafePathError names the directory and what is wrong with it
    if rank == 0:
        removed = remove_dead_engine_dirs(shm_dir)
        if removed:
            log.info("gatherwise: removed %d directories of engines that are gone from %s: %s", len(removed), shm_dir,
                     ", ".join(removed))
    directory = Path(ensure_private_dir(engine_dir(shm_dir, engine_id)))
    return directory, LivenessLock(directory, rank)
