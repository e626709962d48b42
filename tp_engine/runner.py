"""What one rank runs: build the model and the logits path, then drive steps (generation or synthetic load).

`Engine` takes an already-built `LogitsPath` or a factory for one per run, so callers can plug in a recorder,
a table source, or a fresh path per schedule. `generate_rank` is the `gatherwise generate` rank main.

Compute dtype: float64 by default. Row-parallel layers all_reduce partial sums, which adds in a different order
than one TP=1 matmul; in float32 that moves logits by a few ulps across P and can flip a sampled token. In
float64 the cross-P difference is ~1e-16 relative and vanishes when the LM head output is rounded to the logits
dtype (float32/bfloat16), so P=1, 2, 3 produce the same tokens. float32 compute is there for speed.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from gatherwise.engine_hooks.comm import Communicator, default_communicator
from gatherwise.engine_hooks.handshake import handshake
from gatherwise.engine_hooks.logged_path import LoggedLogitsPath
from gatherwise.engine_hooks.logits_path import CallRecorder, LogitsPath
from gatherwise.engine_hooks.sampling import SamplingParams, SamplingRow
from gatherwise.engine_hooks.table_source import ScheduleTableSource, TableSource, initial_schedule_table
from gatherwise.engine_hooks.torch_dtypes import TORCH_LOGITS_DTYPES
from gatherwise.modes import Mode, ModeTable
from gatherwise.stable_hash import stable_hash
from gatherwise.tp_engine.config import ModelConfig, tiny_config
from gatherwise.tp_engine.hf_config import load_hf_config
from gatherwise.tp_engine.kv_cache import KVCache
from gatherwise.tp_engine.layers import TPGroup
from gatherwise.tp_engine.model import TPModel
from gatherwise.tp_engine.same_args import check_same_args
from gatherwise.tp_engine.scheduler import (
    Request,
    Scheduler,
    StepBatch,
    make_requests,
    max_sequence_length,
    prompt_requests,
)
from gatherwise.tp_engine.weights import (
    RandomSource,
    SafetensorsSource,
    TensorSource,
    check_tensor_names,
    shard_weights,
)

GREEDY = SamplingParams()
DTYPES = {"float64": torch.float64, **TORCH_LOGITS_DTYPES}  # compute (float64 is the reference) and logits dtypes


@dataclass(frozen=True)
class ModelSpec:
    """Where the weights come from and how they are computed; identical on every rank."""

    vocab: int = 32000
    checkpoint: str | None = None  # HF Llama/Qwen2 directory; None = the seeded random tiny model
    weights_seed: int = 0
    compute_dtype: str = "float64"
    device: str = "cpu"

    def load(self, tp: TPGroup) -> TPModel:
        config, source = self.config_and_source()
        device = _rank_device(self.device)
        weights = shard_weights(source, config, tp.rank, tp.world_size, DTYPES[self.compute_dtype], device)
        return TPModel(config, weights, tp)

    def config_and_source(self) -> tuple[ModelConfig, TensorSource]:
        if self.checkpoint is None:
            config = tiny_config(self.vocab)
            return config, RandomSource(config, self.weights_seed)
        config, source = load_hf_config(self.checkpoint), SafetensorsSource(self.checkpoint)
        check_tensor_names(source.names(), config)
        return config, source

    def config_hash(self, config: ModelConfig) -> int:
        origin = self.checkpoint or f"random:{self.weights_seed}"
        return stable_hash(json.dumps([dataclasses.asdict(config), origin, self.compute_dtype]))


def _rank_device(device: str) -> torch.device:
    # the launcher set this rank's GPU: a node's i-th rank uses cuda:i, whatever its global rank
    return torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device(device)


def mode_setup(mode: str) -> tuple[ModeTable, Callable[[], TableSource | None]]:
    """`all_gather` | `gather` | `schedule:SEED` -> (initial table on every rank, rank 0's table source factory)."""
    if mode.startswith("schedule:"):
        text = mode.split(":", 1)[1]
        try:
            seed = int(text)
        except ValueError:
            raise ValueError(f"bad schedule seed {text!r} in mode {mode!r}: expected schedule:INTEGER") from None
        return initial_schedule_table(seed), lambda: ScheduleTableSource(seed)
    return ModeTable.uniform(Mode.parse(mode)), lambda: None


def make_path(comm: Communicator, vocab: int, mode: str, logits_dtype: torch.dtype, device: torch.device,
              recorder: CallRecorder | None = None, keep_log: bool = True) -> LogitsPath:
    table, source = mode_setup(mode)
    path_class = LoggedLogitsPath if keep_log else LogitsPath
    return path_class(comm, vocab, dtype=logits_dtype, device=device, initial_table=table,
                      table_source=source() if comm.rank == 0 else None, recorder=recorder)


@dataclass
class RunResult:
    tokens: dict[int, list[int]]  # request id -> generated tokens
    modes: list[str]  # mode label of every logits call
    collectives: list[int]  # collectives issued by every logits call
    batch_sizes: list[int]  # rows of every logits call


PathOrFactory = LogitsPath | Callable[[], LogitsPath]


class Engine:
    def __init__(self, model: TPModel, path: PathOrFactory, max_batch: int = 16) -> None:
        self.model, self._path, self.max_batch = model, path, max_batch

    def _new_path(self) -> LogitsPath:
        return self._path if isinstance(self._path, LogitsPath) else self._path()

    def generate(self, requests: list[Request], on_step: Callable[[StepBatch, torch.Tensor], None] | None = None
                 ) -> RunResult:
        """Run requests to completion with continuous batching; one logits call per step."""
        path = self._new_path()
        cache = self.model.new_cache(self.max_batch, max_sequence_length(requests))
        scheduler = Scheduler(requests, cache, self.max_batch)
        sizes = []
        logged = path if isinstance(path, LoggedLogitsPath) else None  # the path that logs its calls, if it does
        calls_before = len(logged.mode_log) if logged is not None else 0
        while (batch := scheduler.next_batch()) is not None:
            tokens = self.step(path, batch, cache)
            sizes.append(len(batch.rows))
            if on_step is not None:
                on_step(batch, tokens)
            scheduler.complete(tokens.tolist())
        modes = [m.label for m in logged.mode_log[calls_before:]] if logged is not None else []
        colls = list(logged.collective_log[calls_before:]) if logged is not None else []
        return RunResult(dict(sorted(scheduler.finished.items())), modes, colls, sizes)

    def step(self, path: LogitsPath, batch: StepBatch, cache: KVCache) -> torch.Tensor:
        """One forward writing straight into the path's send buffer, then one logits call: tokens [B]."""
        dev = self.model.device
        out = path.logits_buffer(len(batch.rows))
        self.model.forward(torch.tensor(batch.tokens, device=dev), torch.tensor(batch.positions, device=dev),
                           torch.tensor(batch.slots, device=dev), cache,
                           torch.tensor(batch.logit_rows, device=dev), out)
        return path.run(batch.rows)

    def synthetic(self, batch_sizes: Iterable[int], params: Sequence[SamplingParams] = (GREEDY,),
                  context: int = 16, path: LogitsPath | None = None) -> LogitsPath:
        """Synthetic decode load: for each B, one full forward of B single-token rows and one logits call.

        Row j of call i decodes token (i * 7919 + j) mod V at position i mod `context` of KV slot j, with
        params[j mod len(params)], so the work per call is that of a real decode step at a rolling context
        length with a fixed mix of sampling kinds. Returns the path used.
        """
        path = path or self._new_path()
        cache = self.model.new_cache(self.max_batch, context)
        vocab = self.model.config.vocab_size
        for i, rows in enumerate(batch_sizes):
            if not 1 <= rows <= self.max_batch:
                raise ValueError(f"synthetic batch size {rows} outside 1..{self.max_batch}")
            slots = list(range(rows))
            batch = StepBatch(tokens=[(i * 7919 + j) % vocab for j in slots], positions=[i % context] * rows,
                              slots=slots, logit_rows=slots,
                              rows=[SamplingRow(params[j % len(params)], j, i) for j in slots], running=[])
            self.step(path, batch, cache)
        return path


@dataclass(frozen=True)
class GenerateSpec:
    model: ModelSpec
    mode: str = "all_gather"
    num_prompts: int = 8
    max_new_tokens: int = 16
    seed: int = 0
    params: SamplingParams = SamplingParams()
    logits_dtype: str = "float32"
    max_batch: int = 16
    prompts: tuple[tuple[int, ...], ...] = ()  # token ids; empty = `num_prompts` random prompts
    stop_ids: tuple[int, ...] = ()  # end-of-sequence ids every request stops at


def generate_rank(rank: int, world_size: int, spec: GenerateSpec) -> RunResult:
    """Rank main of `gatherwise generate` (inside an initialized process group, or alone at P=1)."""
    tp = TPGroup.from_dist()
    if (tp.rank, tp.world_size) != (rank, world_size):
        raise RuntimeError(f"process group is rank {tp.rank}/{tp.world_size}, expected {rank}/{world_size}")
    comm = default_communicator()
    model = spec.model.load(tp)
    config, logits_dtype = model.config, DTYPES[spec.logits_dtype]
    table, _ = mode_setup(spec.mode)
    handshake(comm, config_hash=spec.model.config_hash(config), table=table, vocab=config.vocab_size,
              dtype=logits_dtype, device=model.device)
    # the checkpoint path may differ between nodes: the handshake above compares the model itself
    check_same_args(comm, repr(dataclasses.replace(spec, model=dataclasses.replace(spec.model, checkpoint=None))),
                    model.device, "generate arguments (prompts, sampling, mode, budget, batch)")
    path = make_path(comm, config.vocab_size, spec.mode, logits_dtype, model.device)
    if spec.prompts:
        requests = prompt_requests(spec.prompts, config.vocab_size, spec.max_new_tokens, spec.params, spec.stop_ids)
    else:
        requests = make_requests(spec.num_prompts, config.vocab_size, spec.max_new_tokens, spec.seed, spec.params,
                                 stop_ids=spec.stop_ids)
    return Engine(model, path, spec.max_batch).generate(requests)

