"""The logits -> tokens path: the collectives in the mode of this call, sampling, token distribution.

Protocol (docs/architecture.md): the mode of a call comes from the table every rank holds. Rank 0 appends the
64-bit control word (table, epoch) to what it sends in the call's own first collective — after its shard in
all_gather mode, after the token ids in gather mode, ahead of its summaries in sharded mode
(engine_hooks.sharded_exchange) — and every rank, rank 0 included, adopts it from the next call on. No extra
collective, and no two ranks ever disagree on a mode.

Buffers are preallocated and reused: the engine's LM head writes straight into `logits_buffer(rows)`, a view
of the send buffer that already has room for the control word, so nothing is copied to append 8 bytes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import torch

from engine_hooks.comm import Communicator
from engine_hooks.modes import ControlWord, Mode, ModeTable
from engine_hooks.sampling import SamplingRow, sample
from engine_hooks.sharded_exchange import ShardedSampler
from engine_hooks.table_source import AppliedStatus, TableSource

_ALIGN = 4  # shard widths are padded to a multiple of 4 so the control word slot is 8-byte aligned


class CallRecorder(Protocol):
    """Receives the timing marks of one call (see engine_hooks.recorder). Must not block."""

    def record(self, call_index: int, mode: Mode, rows: int, epoch: int, nbytes: int, t_start: int,
               coll_start: int, coll_end: int, bcast_start: int, bcast_end: int,
               sample_start: int, sample_end: int, t_end: int, **call_counts: int) -> None: ...


def shard_width(vocab: int, world_size: int) -> int:
    """Columns per rank: ceil(vocab / P) rounded up to a multiple of 4; the tail is padding."""
    width = -(-vocab // world_size)
    return -(-width // _ALIGN) * _ALIGN


class LogitsPath:
    def __init__(self, comm: Communicator, vocab: int, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", initial_table: ModeTable,
                 table_source: TableSource | None = None, recorder: CallRecorder | None = None,
                 clock: Callable[[], int] = time.perf_counter_ns, keep_log: bool = False) -> None:
        if vocab < 1:
            raise ValueError(f"vocab must be >= 1, got {vocab}")
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"logits dtype must be float32, bfloat16 or float16, got {dtype}")
        self.comm = comm
        self.rank, self.world_size = comm.rank, comm.world_size
        self.vocab = vocab
        self.width = shard_width(vocab, self.world_size)
        self.dtype, self.device = dtype, torch.device(device)
        self.table, self.epoch, self.call_index = initial_table, 0, 0
        self.table_source = table_source if self.rank == 0 else None
        self.recorder, self.clock = recorder, clock
        self._elem_size = torch.empty((), dtype=dtype).element_size()
        self._word_elems = 8 // self._elem_size
        self._valid = max(0, min(self.width, vocab - self.rank * self.width))  # real columns of this rank
        self._applied_seq = 0
        self._word = ControlWord(initial_table).pack_signed()  # the word of the current (table, epoch)
        self._capacity = 0
        self._rows = 0
        self._call: tuple | None = None  # (mode, rows, word, t_start, coll_start, coll_end) in flight
        self.mode_log: list[Mode] | None = [] if keep_log else None
        self.collective_log: list[int] | None = [] if keep_log else None
        self._sharded = ShardedSampler(comm, self.width, dtype=dtype, device=self.device, clock=clock)

    # -- buffers ---------------------------------------------------------------------------------------
    def _ensure_capacity(self, rows: int) -> None:
        if rows <= self._capacity:
            return
        cap = max(rows, 2 * self._capacity, 8)
        chunk = cap * self.width + self._word_elems
        self._send = torch.empty(chunk, dtype=self.dtype, device=self.device)
        self._recv = torch.empty(self.world_size * chunk, dtype=self.dtype, device=self.device)
        self._tokens = torch.empty(cap + 1, dtype=torch.int64, device=self.device)
        self._capacity = cap

    def logits_buffer(self, rows: int) -> torch.Tensor:
        """A [rows, width] view the engine's LM head writes this rank's shard into (valid until run())."""
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        self._ensure_capacity(rows)
        self._rows = rows
        return self._send[: rows * self.width].view(rows, self.width)

    # -- the call --------------------------------------------------------------------------------------
    def run(self, rows: list[SamplingRow]) -> torch.Tensor:
        """Combine shards in this call's mode, sample, and return int64 tokens [B] on every rank."""
        t_start = self.clock()
        if self._rows != len(rows) or self._rows == 0:
            raise ValueError(f"logits_buffer({self._rows}) was filled but run() got {len(rows)} rows")
        if self.table.mode_for_rows(self._rows) == Mode.SHARDED:
            return self._run_sharded(rows, t_start)
        mode, shards = self.exchange(t_start=t_start)
        if mode == Mode.ALL_GATHER or self.rank == 0:
            sample_start = self._call[5]  # sampling starts as the collective ends: one clock read for both
            tokens = sample(shards, self.vocab, rows)
            return self.complete(tokens, sample_start=sample_start, sample_end=self.clock())
        return self.complete(None)

    def exchange(self, *, mode: Mode | None = None, t_start: int | None = None) -> tuple[Mode, torch.Tensor]:
        """First half of a call, for engines that sample with their own sampler (vLLM): the collective only.

        Returns (mode, shards [P, B, width]); in gather mode the shards are valid on rank 0 only. `mode`
        overrides the table for this call and must then be the same on every rank. Finish the call with
        complete(): it carries the control word to the other ranks in gather mode and records the call.
        """
        clock = self.clock
        t_start = clock() if t_start is None else t_start
        batch = self._rows
        if batch == 0:
            raise ValueError("exchange() needs logits_buffer(rows) filled first")
        if self._call is not None:
            raise RuntimeError("exchange() called again before complete() finished the previous call")
        mode = self.table.mode_for_rows(batch) if mode is None else mode
        if mode == Mode.SHARDED:
            raise ValueError("a sharded call samples inside the path: use run(), not exchange()")
        word = self._word_to_send() if self.rank == 0 else None
        n = batch * self.width
        chunk = n + self._word_elems
        send = self._send[:chunk]
        if self._valid < self.width:
            send[:n].view(batch, self.width)[:, self._valid:] = float("-inf")
        if word is not None:
            send[n:].view(torch.int64).fill_(word)
        recv = self._recv[: self.world_size * chunk].view(self.world_size, chunk)
        coll_start = clock()
        if mode == Mode.ALL_GATHER:
            self.comm.all_gather(recv, send)
            self._adopt(int(recv[0, n:].view(torch.int64).item()))
        else:
            self.comm.gather(recv if self.rank == 0 else None, send)
        self._call = (mode, batch, word, t_start, coll_start, clock())
        return mode, recv[:, :n].view(self.world_size, batch, self.width)

    def complete(self, tokens: torch.Tensor | None, *, sample_start: int | None = None,
                 sample_end: int | None = None) -> torch.Tensor | None:
        """Second half of a call. In gather mode rank 0 passes the sampled int64 tokens [B]; they reach every
        rank by one broadcast that also carries the control word, and are returned. In all_gather mode every
        rank sampled for itself: `tokens` is returned as given. Sample marks are `clock` values (None: this
        rank did not sample).
        """
        if self._call is None:
            raise RuntimeError("complete() without exchange()")
        clock = self.clock
        mode, batch, word, t_start, coll_start, coll_end = self._call
        self._call = None
        if sample_start is None or sample_end is None:
            sample_start = sample_end = coll_end  # this rank did not sample
        bcast_start = bcast_end = 0
        if mode != Mode.ALL_GATHER:
            tokens_buf = self._tokens[: batch + 1]
            if self.rank == 0:
                tokens_buf[:batch] = tokens
                tokens_buf[batch] = word
            bcast_start = clock()
            self.comm.broadcast(tokens_buf)
            bcast_end = clock()
            tokens = tokens_buf[:batch].clone()
            self._adopt(int(tokens_buf[batch].item()))
        t_end = clock()
        if self.recorder is not None:
            chunk = batch * self.width + self._word_elems
            nbytes = (self.world_size if mode == Mode.ALL_GATHER or self.rank == 0 else 1) * chunk * self._elem_size
            self.recorder.record(self.call_index, mode, batch, self.epoch, nbytes, t_start, coll_start, coll_end,
                                 bcast_start, bcast_end, sample_start, sample_end, t_end)
        if self.mode_log is not None:
            self.mode_log.append(mode)
            self.collective_log.append(1 if mode == Mode.ALL_GATHER else 2)
        self.call_index += 1
        self._rows = 0
        return tokens

    def _run_sharded(self, rows: list[SamplingRow], t_start: int) -> torch.Tensor:
        """A whole sharded call: exchange, sample and resolve in engine_hooks.sharded_exchange, then record."""
        batch = self._rows
        logits = self._send[: batch * self.width].view(batch, self.width)
        if self._valid < self.width:
            logits[:, self._valid:] = float("-inf")
        call = self._sharded.run(logits, rows, self._word_to_send() if self.rank == 0 else self._word)
        self._adopt(int(call.word_in.item()))
        t_end = self.clock()
        if self.recorder is not None:
            self.recorder.record(self.call_index, Mode.SHARDED, batch, self.epoch, call.exchange_bytes, t_start,
                                 call.coll_start, call.coll_end, call.resolve_start, call.resolve_end,
                                 call.sample_start, call.sample_end, t_end, resolve_nbytes=call.resolve_bytes,
                                 topp_rows=call.topp_rows, fallback_rows=call.fallback_rows)
        if self.mode_log is not None:
            self.mode_log.append(Mode.SHARDED)
            self.collective_log.append(call.collectives)
        self.call_index += 1
        self._rows = 0
        return call.tokens

    def _word_to_send(self) -> int:
        """Rank 0: the control word for this call — the current table, or a newly requested one."""
        request = self.table_source.poll(self.call_index) if self.table_source is not None else None
        if request is None or request.seq == self._applied_seq:
            return self._word
        self._applied_seq = request.seq
        epoch = self.epoch if request.table == self.table else (self.epoch + 1) % (1 << 24)
        self.table_source.report(AppliedStatus(request.seq, self.call_index + 1, request.table, epoch))
        return ControlWord(request.table, epoch, request.flags).pack_signed()

    def _adopt(self, word: int) -> None:
        if word != self._word:  # decode only when the word changed
            cw = ControlWord.unpack(word)
            self.table, self.epoch, self._word = cw.table, cw.epoch, word
