"""Requests and the deterministic continuous-batching scheduler (identical on every rank).

Each step: requests whose arrival step has come join (up to `max_batch` running) and are prefilled, running
ones decode one token, and all of them produce one logits row -> one logits call per step. Requests leave after
their own `max_new_tokens` or at a stop token (end of sequence; kept as the last token, as transformers does), so
the batch size moves between steps. Nothing depends on time or on the rank.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gatherwise.engine_hooks.sampling import SamplingParams, SamplingRow
from gatherwise.tp_engine.kv_cache import KVCache

GREEDY = SamplingParams()


@dataclass(frozen=True)
class Request:
    request_id: int
    prompt: tuple[int, ...]
    max_new_tokens: int
    arrival_step: int = 0
    params: SamplingParams = GREEDY
    stop_ids: frozenset[int] = frozenset()  # the request ends after sampling one of these

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError(f"request {self.request_id}: empty prompt")
        if self.max_new_tokens < 1:
            raise ValueError(f"request {self.request_id}: max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class Running:
    request: Request
    slot: int
    generated: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class StepBatch:
    """The flat token batch of one step and its logits rows (one per running request)."""

    tokens: list[int]
    positions: list[int]
    slots: list[int]
    logit_rows: list[int]  # index into the flat tokens of each request's last token
    rows: list[SamplingRow]
    running: list[Running]


class Scheduler:
    def __init__(self, requests: list[Request], cache: KVCache, max_batch: int = 16) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_batch > cache.num_slots:
            raise ValueError(f"max_batch {max_batch} exceeds the KV cache's {cache.num_slots} slots")
        self._pending = sorted(requests, key=lambda r: (r.arrival_step, r.request_id))
        self._running: list[Running] = []
        self._cache, self.max_batch = cache, max_batch
        self.step = 0
        self.finished: dict[int, list[int]] = {}
        self._batch: StepBatch | None = None

    @property
    def done(self) -> bool:
        return not self._pending and not self._running

    def next_batch(self) -> StepBatch | None:
        """The next step's batch, or None when every request has finished."""
        if self.done:
            return None
        if not self._running and self._pending[0].arrival_step > self.step:
            self.step = self._pending[0].arrival_step  # idle until the next arrival: no logits call
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logit_rows: list[int] = []
        rows: list[SamplingRow] = []
        decoding = list(self._running)
        for run in decoding:
            tokens.append(run.generated[-1])
            positions.append(len(run.request.prompt) + len(run.generated) - 1)
            slots.append(run.slot)
            logit_rows.append(len(tokens) - 1)
        while (self._pending and self._pending[0].arrival_step <= self.step
               and len(self._running) < self.max_batch):
            req = self._pending.pop(0)
            run = Running(req, self._cache.allocate())
            self._running.append(run)
            tokens.extend(req.prompt)
            positions.extend(range(len(req.prompt)))
            slots.extend([run.slot] * len(req.prompt))
            logit_rows.append(len(tokens) - 1)
        for run in self._running:
            rows.append(SamplingRow(run.request.params, run.request.request_id, len(run.generated)))
        self._batch = StepBatch(tokens, positions, slots, logit_rows, rows, list(self._running))
        return self._batch

    def complete(self, new_tokens: list[int]) -> None:
        """Append each row's sampled token; retire requests that reached their max_new_tokens."""
        batch, self._batch = self._batch, None
        if batch is None or len(new_tokens) != len(batch.running):
            raise RuntimeError("complete() must follow next_batch() with one token per row")
        still = []
        for run, token in zip(batch.running, new_tokens, strict=True):
            run.generated.append(int(token))
            if len(run.generated) >= run.request.max_new_tokens or run.generated[-1] in run.request.stop_ids:
                self.finished[run.request.request_id] = run.generated
                self._cache.release(run.slot)
            else:
                still.append(run)
        self._running = still
        self.step += 1


def make_requests(num: int, vocab: int, max_new_tokens: int, seed: int = 0,
                  params: SamplingParams | list[SamplingParams] = GREEDY,
                  max_prompt_len: int = 12, max_gap: int = 2, stop_ids: Iterable[int] = ()) -> list[Request]:
    """Deterministic prompts of random ids and lengths 1..max_prompt_len, staggered arrivals (gaps of 0..max_gap
    steps) and budgets drawn in [ceil(T/2), T] so requests join and leave at different steps."""
    if num < 1:
        raise ValueError(f"need at least one request, got {num}")
    rng = random.Random(seed)
    plist = params if isinstance(params, list) else [params]
    requests, arrival, stops = [], 0, frozenset(stop_ids)
    for i in range(num):
        prompt = tuple(rng.randrange(vocab) for _ in range(rng.randint(1, max_prompt_len)))
        budget = rng.randint((max_new_tokens + 1) // 2, max_new_tokens)
        requests.append(Request(i, prompt, budget, arrival, plist[i % len(plist)], stops))
        arrival += rng.randint(0, max_gap)
    return requests


def prompt_requests(prompts: Sequence[Sequence[int]], vocab: int, max_new_tokens: int,
                    params: SamplingParams = GREEDY, stop_ids: Iterable[int] = ()) -> list[Request]:
    """Given prompts (token ids), all arriving at once, each with the full budget `max_new_tokens`."""
    for i, prompt in enumerate(prompts):
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt {i}: token id {bad[0]} outside the vocabulary 0..{vocab - 1}")
    stops = frozenset(stop_ids)
    return [Request(i, tuple(p), max_new_tokens, 0, params, stops) for i, p in enumerate(prompts)]


def max_sequence_length(requests: list[Request]) -> int:
    return max(len(r.prompt) + r.max_new_tokens for r in requests)
