"""Build a tiny random Llama checkpoint (HF format) without any hub access: `python build_tiny_llama.py DIR`.

Shapes: hidden 128, intermediate 256, 2 layers, 4 heads, 2 KV heads, vocab 32000; fixed seed, float32.
"""

from __future__ import annotations

import sys


def build_tiny_llama(out_dir: str, seed: int = 1234) -> str:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=32000, max_position_embeddings=512,
                         torch_dtype="float32", tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(out_dir)
    return out_dir


if __name__ == "__main__":
    print(build_tiny_llama(sys.argv[1]))
