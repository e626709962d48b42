"""The tensor-parallel Llama decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) of one rank, with the blocks
Gemma3 adds (embedding scale, q/k norms, norms on the attention and MLP outputs, GeGLU, RoPE per layer type).

One forward handles a flat batch of tokens from many requests — whole prompts of newly joined requests and one
token of each running request — each token at its own (KV slot, position). Every token first writes its K/V
into the cache, then attends to positions 0..its own of its slot, so prefill and decode are the same code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gatherwise.tp_engine.config import ModelConfig
from gatherwise.tp_engine.kv_cache import KVCache
from gatherwise.tp_engine.layers import (
    TPGroup,
    column_parallel,
    head_shard,
    lm_head_into,
    row_parallel,
    vocab_parallel_embedding,
    vocab_span,
)
from gatherwise.tp_engine.rope import apply_rope, rope_tables
from gatherwise.tp_engine.weights import RankWeights


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


ACTIVATION_FUNCTIONS = {"silu": F.silu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}


class TPModel:
    def __init__(self, config: ModelConfig, weights: RankWeights, tp: TPGroup) -> None:
        self.config, self.weights, self.tp = config, weights, tp
        self.heads = head_shard(config, tp.rank, tp.world_size)
        self.vocab_start = vocab_span(config.vocab_size, tp.rank, tp.world_size).start
        self.dtype = weights.embed.dtype
        self.device = weights.embed.device
        self.kv_of_q = torch.tensor(self.heads.kv_of_q, dtype=torch.int64, device=self.device)
        self.shard_width = weights.lm_head.shape[0]

    def new_cache(self, num_slots: int, max_len: int) -> KVCache:
        return KVCache(self.config.num_layers, num_slots, self.heads.kv.size, max_len, self.config.head_dim,
                       dtype=self.dtype, device=self.device)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, cache: KVCache,
                logit_rows: torch.Tensor, out: torch.Tensor) -> None:
        """Run tokens [T] at (slots, positions) through the model; write logits of `logit_rows` into `out`.

        `out` is [len(logit_rows), shard width] — normally `LogitsPath.logits_buffer(B)`.
        """
        cfg, w, tp = self.config, self.weights, self.tp
        num_tokens, hd = tokens.shape[0], cfg.head_dim
        nq, nkv = self.heads.q.size, self.heads.kv.size
        tables = {rope: rope_tables(positions, hd, rope, self.dtype) for rope in
                  {cfg.layer_rope(i) for i in range(cfg.num_layers)}}
        length = int(positions.max()) + 1
        behind = positions[:, None] - torch.arange(length, device=self.device)[None, :]  # [T, L] query - key
        future = behind < 0  # causal mask
        windowed = {w: future | (behind >= w) for w in set(cfg.sliding_windows) if w is not None}
        scale = cfg.attention_scale if cfg.attention_scale is not None else hd ** -0.5
        act_fn = ACTIVATION_FUNCTIONS[cfg.activation]
        eps = cfg.rms_norm_eps
        x = vocab_parallel_embedding(tokens, w.embed, self.vocab_start, tp)
        if cfg.embedding_scale != 1.0:
            x = x * cfg.embedding_scale
        for i, layer in enumerate(w.layers):
            h = rms_norm(x, layer.input_norm, eps)
            q = column_parallel(h, layer.q, layer.q_bias).view(num_tokens, nq, hd)
            k = column_parallel(h, layer.k, layer.k_bias).view(num_tokens, nkv, hd)
            v = column_parallel(h, layer.v, layer.v_bias).view(num_tokens, nkv, hd)
            if layer.q_norm is not None and layer.k_norm is not None:
                q, k = rms_norm(q, layer.q_norm, eps), rms_norm(k, layer.k_norm, eps)
            cos, sin = tables[cfg.layer_rope(i)]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            cache.write(i, slots, positions, k, v)
            keys, values = cache.read(i, slots, length)  # [T, nkv, L, hd]
            keys, values = keys[:, self.kv_of_q], values[:, self.kv_of_q]  # GQA: [T, nq, L, hd]
            scores = torch.einsum("thd,thld->thl", q, keys) * scale
            window = cfg.sliding_window(i)
            scores.masked_fill_((future if window is None else windowed[window])[:, None, :], float("-inf"))
            attn = torch.einsum("thl,thld->thd", scores.softmax(dim=-1), values).reshape(num_tokens, nq * hd)
            y = row_parallel(attn, layer.o, tp, layer.o_bias)
            x = x + (y if layer.attn_out_norm is None else rms_norm(y, layer.attn_out_norm, eps))
            h = rms_norm(x, layer.post_norm, eps)
            act = act_fn(column_parallel(h, layer.gate, layer.gate_bias)) * column_parallel(h, layer.up, layer.up_bias)
            y = row_parallel(act, layer.down, tp, layer.down_bias)
            x = x + (y if layer.mlp_out_norm is None else rms_norm(y, layer.mlp_out_norm, eps))
        h = rms_norm(x[logit_rows], w.final_norm, eps)
        lm_head_into(h, w.lm_head, out)
