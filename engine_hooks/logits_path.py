"""The logits -> tokens path: the collectives in the mode of this call, sampling, token distribution.

Protocol (docs/architecture.md): the mode of a call comes from the table every rank holds. Rank 0 appends
the 64-bit control word (table, epoch) to what it sends in the call's own first collective — after its shard
in all_gather mode, after the token ids in gather mode, ahead of its summaries in sharded mode
(gatherwise.engine_hooks.sharded_exchange) — and every rank, rank 0 included, adopts it ADOPT_LAG
calls later (gatherwise.engine_hooks.deferred_word): no rank reads a device value on the host during the call, no extra
collective, and no two ranks ever disagree on a mode.

Buffers are preallocated and reused: the engine's LM head writes straight into `logits_buffer(rows)`, a view
of the send buffer that already has room for the control word, so nothing is copied to append 8 bytes.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol, overload

import torch

from gatherwise.call_kind import call_tag
from gatherwise.engine_hooks.call_marks import CallMarks
from gatherwise.engine_hooks.comm import Communicator
from gatherwise.engine_hooks.deferred_word import ADOPT_LAG, DeferredWords
from gatherwise.engine_hooks.sampling import SamplingRow, sample
from gatherwise.engine_hooks.sampling_params import kind_of_rows
from gatherwise.engine_hooks.sharded_exchange import ShardedCall, ShardedSampler
from gatherwise.engine_hooks.table_source import AppliedStatus, TableSource
from gatherwise.engine_hooks.torch_dtypes import TORCH_LOGITS_DTYPES
from gatherwise.modes import EPOCH_BITS, ControlWord, Mode, ModeTable

_ALIGN = 4  # shard widths are padded to a multiple of 4 so the control word slot is 8-byte aligned


class CallRecorder(Protocol):
    """Receives the marks of every call (e.g. engine_hooks.recorder's RingRecorder). Must not block. The path
    refills the same CallMarks at its next call: a recorder that keeps marks keeps `marks.copy()`."""

    def record(self, marks: CallMarks, /) -> None: ...


class OpenCall:
    """A call between its collective and its end: what complete() (or a sharded call, or a graph replay) needs
    to finish it, its marks filled as it goes into the record the path hands its recorder. One per path,
    refilled by every call, so the hot path allocates nothing for it (engine_hooks.call_marks)."""

    __slots__ = ("kind", "marks", "mode", "word_in")

    def __init__(self) -> None:
        self.marks = CallMarks(*[0] * 13)

    def fill(self, mode: Mode, rows: int, t_start: int, coll_start: int, coll_end: int,
             word_in: torch.Tensor | None, kind: int) -> OpenCall:
        m = self.marks
        m.mode = mode
        m.rows = rows
        m.t_start = t_start
        m.coll_start = coll_start
        m.coll_end = coll_end
        self.mode, self.kind, self.word_in = mode, kind, word_in  # the Mode itself: marks.mode is its code
        return self


def _no_clock() -> int:
    return 0


def shard_width(vocab: int, world_size: int) -> int:
    """Columns per rank: ceil(vocab / P) rounded up to a multiple of 4; the tail is padding."""
    width = -(-vocab // world_size)
    return -(-width // _ALIGN) * _ALIGN


class LogitsPath:
    def __init__(self, comm: Communicator, vocab: int, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", initial_table: ModeTable,
                 table_source: TableSource | None = None, recorder: CallRecorder | None = None,
                 clock: Callable[[], int] = time.perf_counter_ns) -> None:
        if vocab < 1:
            raise ValueError(f"vocab must be >= 1, got {vocab}")
        if dtype not in TORCH_LOGITS_DTYPES.values():
            raise ValueError(f"logits dtype must be one of {', '.join(TORCH_LOGITS_DTYPES)}, got {dtype}")
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
        self._due: deque[AppliedStatus] = deque()  # rank 0: requests on the wire, reported once they take effect
        self._word = ControlWord(initial_table).pack_signed()  # the word of the current (table, epoch)
        # Rank 0: the word it puts on the wire; ahead of `_word` for ADOPT_LAG calls after a request.
        self._sent = ControlWord(initial_table)
        self._sent_word = self._word
        # The word to send lives on the device and reaches the send buffers by a device copy: no host value is
        # baked into a captured CUDA graph, and a new word costs one fill, only when it changes.
        self._word_dev = torch.full((1,), self._word, dtype=torch.int64, device=self.device)
        self._deferred = DeferredWords(self.device)
        self._capture: Mode | None = None  # set while a CUDA graph variant is captured (gatherwise.engine_hooks.graphs)
        self._captured_word_in: dict[tuple[Mode, int], torch.Tensor | None] = {}
        self._captured_open: set[tuple[Mode, int]] = set()  # variants that captured exchange() only
        self._capacity = 0
        self._rows = 0
        self._call: OpenCall | None = None  # the call in flight between exchange() and complete()
        self._open_call = OpenCall()
        self._table_mode = Mode.ALL_GATHER  # the mode the table names for the call begin_call() last ran for
        self._sharded = ShardedSampler(comm, self.width, dtype=dtype, device=self.device, clock=clock)
        self._begun = -1  # the call index begin_call() last ran for

    # -- buffers ---------------------------------------------------------------------------------------
    def _ensure_capacity(self, rows: int) -> None:
        if rows <= self._capacity:
            return
        if self._captured_word_in:  # captured graphs hold the current buffers' addresses
            raise RuntimeError(f"{rows} rows exceed the {self._capacity} reserved before CUDA graphs were captured: "
                               "call reserve(max_rows) before capturing")
        cap = max(rows, 2 * self._capacity, 8)
        chunk = cap * self.width + self._word_elems
        self._send = torch.empty(chunk, dtype=self.dtype, device=self.device)
        self._recv = torch.empty(self.world_size * chunk, dtype=self.dtype, device=self.device)
        self._tokens = torch.empty(cap + 1, dtype=torch.int64, device=self.device)
        self._capacity = cap

    def reserve(self, rows: int) -> None:
        """Allocate the buffers for up to `rows` rows now (before capturing CUDA graphs, which pin them)."""
        self._ensure_capacity(rows)

    def logits_buffer(self, rows: int) -> torch.Tensor:
        """A [rows, width] view the engine's LM head writes this rank's shard into (valid until run())."""
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        self._ensure_capacity(rows)
        self._rows = rows
        return self._send[: rows * self.width].view(rows, self.width)

    # -- the call --------------------------------------------------------------------------------------
    def run(self, rows: list[SamplingRow], kind: int | None = None) -> torch.Tensor:
        """Combine shards in this call's mode, sample, and return int64 tokens [B] on every rank. `kind`: the
        call kind when the caller knows it (gatherwise.call_kind), else it is read from the rows."""
        t_start = self.clock()
        if self._rows != len(rows) or self._rows == 0:
            raise ValueError(f"logits_buffer({self._rows}) was filled but run() got {len(rows)} rows")
        if kind is None:
            kind = kind_of_rows(rows)
        if self._capture is None and self.begin_call(self._rows) == Mode.SHARDED:
            return self._run_sharded(rows, t_start, kind)
        mode, shards = self.exchange(t_start=t_start, kind=kind)
        # sampling starts as the collective ends: one clock read for both (exchange() just filled _open_call)
        return self.draw(mode, shards, rows, sample_start=self._open_call.marks.coll_end)

    def draw(self, mode: Mode, shards: torch.Tensor, rows: list[SamplingRow], *,
             sample_start: int | None = None) -> torch.Tensor:
        """The second half of an all_gather or gather call that gatherwise's sampler draws, after exchange():
        every rank samples the full layout (all_gather), or rank 0 does and the tokens reach every rank by the
        call's broadcast; int64 tokens [B] on every rank. `sample_start`: when sampling began (default now)."""
        if mode == Mode.ALL_GATHER or self.rank == 0:
            start = self.clock() if sample_start is None else sample_start
            tokens = sample(shards, self.vocab, rows)
            return self.complete(tokens, sample_start=start, sample_end=self.clock())
        received = self.complete(None)
        assert received is not None  # gather mode: the broadcast brings rank 0's tokens
        return received

    def exchange(self, *, mode: Mode | None = None, t_start: int | None = None,
                 kind: int = 0) -> tuple[Mode, torch.Tensor]:
        """First half of a call, for engines that sample with their own sampler (vLLM): the collective only.

        Returns (mode, shards [P, B, width]); in gather mode the shards are valid on rank 0 only. `mode`
        overrides the table for this call and must then be the same on every rank; `kind` is what the engine
        samples in this call (gatherwise.call_kind), recorded with it. Finish the call with
        complete(): it carries the control word to the other ranks in gather mode and records the call.
        Sharded mode samples inside the path (run()): where the table says sharded, exchange() runs all_gather
        (recorded as such), so an engine with its own sampler gets the full logits as it always did.
        """
        clock = self.clock
        t_start = clock() if t_start is None else t_start
        batch = self._rows
        if batch == 0:
            raise ValueError("exchange() needs logits_buffer(rows) filled first")
        if self._call is not None:
            raise RuntimeError("exchange() called again before complete() finished the previous call")
        if mode == Mode.SHARDED:
            raise ValueError("a sharded call samples inside the path: use run(), not exchange()")
        if self._capture is None:
            table_mode = self.begin_call(batch)
            mode = (Mode.ALL_GATHER if table_mode == Mode.SHARDED else table_mode) if mode is None else mode
        elif mode is None or mode == self._capture:
            mode = self._capture
        else:
            raise ValueError(f"capturing the {self._capture.label} variant, but exchange() was asked for {mode.label}")
        n = batch * self.width
        chunk = n + self._word_elems
        send = self._send[:chunk]
        if self._valid < self.width:
            send[:n].view(batch, self.width)[:, self._valid:] = float("-inf")
        if self.rank == 0:
            send[n:].view(torch.int64).copy_(self._word_dev)
        recv = self._recv[: self.world_size * chunk].view(self.world_size, chunk)
        coll_start = clock()
        word_in = None
        if mode == Mode.ALL_GATHER:
            self.comm.all_gather(recv, send)
            word_in = recv[0, n:].view(torch.int64)
        else:
            self.comm.gather(recv if self.rank == 0 else None, send)
        self._call = self._open_call.fill(mode, batch, t_start, coll_start, clock(), word_in, kind)
        if self._capture is not None:
            self._captured_word_in[(mode, batch)] = word_in  # None in gather mode: complete() brings it
        return mode, recv[:, :n].view(self.world_size, batch, self.width)

    def begin_call(self, rows: int) -> Mode:
        """Host part of the start of a call: adopt the word that is due, let rank 0 read its table source,
        and return this call's mode from the table. exchange() calls it; an engine that replays a captured
        CUDA graph calls it (through gatherwise.engine_hooks.graphs) to choose the variant before replay. Runs once per
        call: a second call for the same call index only returns the mode."""
        if self._begun == self.call_index:
            self._table_mode = self.table.mode_for_rows(rows)
            return self._table_mode
        self._begun = self.call_index
        word = self._deferred.take(self.call_index)
        if word is not None and word != self._word:  # decode only when the word changed
            cw = ControlWord.unpack(word)
            self.table, self.epoch, self._word = cw.table, cw.epoch, word
        source = self.table_source
        if source is not None:
            word = self._word_to_send(source)
            if word != self._sent_word:
                self._word_dev.fill_(word)  # a kernel with the value as argument: no synchronization
                self._sent_word = word
            # after poll() put this call in the heartbeat: a status saying "applied" never precedes it
            while self._due and self._due[0].apply_call <= self.call_index:  # every rank runs it from this call
                source.report(self._due.popleft())
        self._table_mode = self.table.mode_for_rows(rows)
        return self._table_mode

    @overload
    def complete(self, tokens: torch.Tensor, *, sample_start: int | None = None,
                 sample_end: int | None = None) -> torch.Tensor: ...

    @overload
    def complete(self, tokens: None, *, sample_start: int | None = None,
                 sample_end: int | None = None) -> torch.Tensor | None: ...

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
        call = self._call
        self._call = None
        mode, batch, word_in = call.mode, call.marks.rows, call.word_in
        if sample_start is None or sample_end is None:
            sample_start = sample_end = call.marks.coll_end  # this rank did not sample
        second_start = second_end = 0
        if mode != Mode.ALL_GATHER:
            tokens_buf = self._tokens[: batch + 1]
            if self.rank == 0:
                if tokens is None:  # what assigning None below raised, said plainly
                    raise TypeError("complete(): rank 0 passes the sampled tokens in gather mode")
                tokens_buf[:batch] = tokens
                tokens_buf[batch:].copy_(self._word_dev)
            second_start = clock()
            self.comm.broadcast(tokens_buf)
            second_end = clock()
            tokens = tokens_buf[:batch].clone()
            word_in = tokens_buf[batch:]
        if self._capture is not None:  # graph capture: device work only; the replay does the host part
            self._captured_word_in[(mode, batch)] = word_in
            self._rows = 0
            return tokens
        assert word_in is not None  # all_gather: exchange() took it from the collective; else the broadcast above
        call.word_in = word_in
        self._end_call(call, second_start, second_end, sample_start, sample_end)
        return tokens

    def _end_call(self, call: OpenCall, second_start: int, second_end: int, sample_start: int, sample_end: int,
                  sharded: ShardedCall | None = None) -> None:
        """Host part of the end of a call: stash the received word for later adoption, record, count. Every
        call that runs ends here (engine_hooks.logged_path logs calls by extending it). second_*: the call's
        second operation (the token broadcast, or a sharded call's shard_resolve)."""
        assert call.word_in is not None  # every call that ends received its control word
        self._deferred.stash(self.call_index, call.word_in)
        t_end = self.clock()
        if self.recorder is not None:
            m = call.marks  # mode, rows, t_start and the collective's marks are in it already
            m.call_index = self.call_index
            m.epoch = self.epoch
            m.second_start = second_start
            m.second_end = second_end
            m.sample_start = sample_start
            m.sample_end = sample_end
            m.t_end = t_end
            m.tag = call_tag(call.kind, self._table_mode) if call.kind else 0
            if sharded is not None:
                m.nbytes = sharded.exchange_bytes
                m.resolve_nbytes = sharded.resolve_bytes
                m.topp_rows = sharded.topp_rows
                m.fallback_rows = sharded.fallback_rows
            else:
                senders = self.world_size if m.mode == Mode.ALL_GATHER or self.rank == 0 else 1
                m.nbytes = senders * (m.rows * self.width + self._word_elems) * self._elem_size
                m.resolve_nbytes = m.topp_rows = m.fallback_rows = 0
            self.recorder.record(m)
        self.call_index += 1
        self._rows = 0

    def _run_sharded(self, rows: list[SamplingRow], t_start: int, kind: int) -> torch.Tensor:
        """A whole sharded call (after begin_call): exchange, sample and resolve in engine_hooks.sharded_exchange,
        then the host part of the end of the call."""
        batch = self._rows
        logits = self._send[: batch * self.width].view(batch, self.width)
        if self._valid < self.width:
            logits[:, self._valid:] = float("-inf")
        sharded = self._sharded.run(logits, rows, self._word_dev)
        call = self._open_call.fill(Mode.SHARDED, batch, t_start, sharded.coll_start, sharded.coll_end,
                                    sharded.word_in, kind)
        self._end_call(call, sharded.resolve_start, sharded.resolve_end, sharded.sample_start, sharded.sample_end,
                       sharded)
        return sharded.tokens

    def run_winners(self, values: torch.Tensor, ids: torch.Tensor, kind: int, *, t_start: int, sample_start: int,
                    sample_end: int) -> torch.Tensor:
        """A sharded call (after begin_call) whose rows every rank scored on its own shard with the engine's own
        keyed sampler: `values` [B] and global `ids` [B] of this shard's winners (ShardedSampler.exchange_winners);
        int64 tokens [B] on every rank. The sample marks are the scoring's."""
        if self._rows != values.numel() or self._rows == 0:
            raise ValueError(f"logits_buffer({self._rows}) was filled but run_winners() got {values.numel()} rows")
        sharded = self._sharded.exchange_winners(values, ids, self._word_dev, sample_start=sample_start,
                                                 sample_end=sample_end)
        call = self._open_call.fill(Mode.SHARDED, self._rows, t_start, sharded.coll_start, sharded.coll_end,
                                    sharded.word_in, kind)
        self._end_call(call, 0, 0, sample_start, sample_end, sharded)
        return sharded.tokens

    # -- CUDA graphs (driven by gatherwise.engine_hooks.graphs) ---------------------------------------------------
    @contextmanager
    def capturing(self, mode: Mode) -> Iterator[None]:
        """While open, exchange()/complete() enqueue only the device work of a `mode` call (what a CUDA graph
        can hold) and remember where its control word lands; finish_replay() does the host part per replay."""
        if self._call is not None or self._capture is not None:
            raise RuntimeError("capturing() inside a call or another capture")
        self._capture, clock = mode, self.clock
        self.clock = _no_clock  # nothing may be timed inside a graph (a CUDA event clock would record into it)
        try:
            yield
        finally:
            self._capture, self.clock = None, clock
            if self._call is not None:  # only exchange() was captured: complete() runs after each replay
                self._captured_open.add((mode, self._call.marks.rows))
                self._call = None

    def finish_replay(self, mode: Mode, rows: int, t_start: int, t_end: int, kind: int = 0) -> None:
        """After replaying the captured (mode, rows) variant: the host part of the call. Inside a graph the
        path cannot read clocks, so the collective mark spans the replay and sampling and the broadcast
        are recorded with zero duration (docs/architecture.md). A variant that captured exchange() only
        leaves the call open: the engine finishes it with complete(), as after an eager exchange()."""
        if (mode, rows) not in self._captured_word_in:
            raise KeyError(f"no captured variant for mode {mode.label} with {rows} rows")
        word_in = self._captured_word_in[(mode, rows)]
        if (mode, rows) in self._captured_open:
            self._rows = rows
            self._call = self._open_call.fill(mode, rows, t_start, t_start, t_end, word_in, kind)
            return
        second = t_end if mode != Mode.ALL_GATHER else 0
        call = self._open_call.fill(mode, rows, t_start, t_start, t_end, word_in, kind)
        self._end_call(call, second, second, t_end, t_end)

    def _word_to_send(self, source: TableSource) -> int:
        """Rank 0: the control word for this call — the last one sent, or a newly requested one."""
        request = source.poll(self.call_index)
        if request is None or request.seq == self._applied_seq:
            return self._sent_word
        self._applied_seq = request.seq
        sent = self._sent
        epoch = sent.epoch if request.table == sent.table else (sent.epoch + 1) % (1 << EPOCH_BITS)
        self._sent = ControlWord(request.table, epoch)
        self._due.append(AppliedStatus(request.seq, self.call_index + ADOPT_LAG, request.table, epoch))
        return self._sent.pack_signed()

    @property
    def adopt_waits(self) -> int:
        """Calls that had to wait for the device to deliver a control word (the host ran too far ahead)."""
        return self._deferred.waits
