"""Write a tiny random Llama checkpoint with transformers' own save_pretrained, without downloading anything.
Needs transformers (the `dev` extra). The weights are random, so any text is nonsense.

    python scripts/tiny_checkpoint.py /tmp/tiny-llama
        with a small BPE tokenizer.json and a chat template: try `gatherwise generate --checkpoint DIR --prompt TEXT`
    python scripts/tiny_checkpoint.py /tmp/tiny-llama --for-engines
        no tokenizer, a 32000-token vocabulary: what the vLLM and SGLang tests load (token-id prompts)
    python scripts/tiny_checkpoint.py /tmp/tiny-llama --for-engines --tokenizer
        the engines' shapes with the small BPE tokenizer: what the structured-output tests load (grammars need
        the tokenizer's vocabulary)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests._hf_checkpoints import TinyCheckpoint, build, write_tokenizer

LAYERS: dict[str, Any] = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
# With a tokenizer: small, and a Llama 3 RoPE, so `gatherwise generate` runs its scaled-RoPE path.
WITH_TOKENIZER: dict[str, Any] = dict(
    LAYERS, hidden_size=64, intermediate_size=128, bos_token_id=1, eos_token_id=2,
    rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
# For vLLM's and SGLang's CPU attention: a head size of 32 (hidden 128 over 4 heads), room for 512 positions.
FOR_ENGINES: dict[str, Any] = dict(LAYERS, hidden_size=128, intermediate_size=256, max_position_embeddings=512,
                                   tie_word_embeddings=False, vocab_size=32000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--for-engines", action="store_true",
                        help="no tokenizer, vocab 32000, shapes vLLM's and SGLang's CPU paths take")
    parser.add_argument("--tokenizer", action="store_true",
                        help="with --for-engines: the small BPE tokenizer and its vocabulary instead of 32000 ids")
    args = parser.parse_args()
    if args.directory.exists() and any(args.directory.iterdir()):
        parser.error(f"{args.directory} exists and is not empty")
    if args.tokenizer and not args.for_engines:
        parser.error("--tokenizer goes with --for-engines (the default checkpoint has a tokenizer already)")
    if args.for_engines:
        config = dict(FOR_ENGINES, vocab_size=write_tokenizer(args.directory)) if args.tokenizer else FOR_ENGINES
    else:
        config = dict(WITH_TOKENIZER, vocab_size=write_tokenizer(args.directory))
    build(TinyCheckpoint("tiny", "llama", config), args.directory)
    print(f"wrote {args.directory}: " + ", ".join(sorted(p.name for p in args.directory.iterdir())))


if __name__ == "__main__":
    main()
