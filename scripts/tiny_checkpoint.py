"""Write a tiny random Llama checkpoint with transformers' own save_pretrained, plus a small BPE tokenizer.json
and a chat template: a local directory to try `gatherwise generate --checkpoint DIR --prompt TEXT` on without
downloading anything. Needs the `dev` extra (transformers). The weights are random, so the text is nonsense.

    python scripts/tiny_checkpoint.py /tmp/tiny-llama
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests._hf_checkpoints import TinyCheckpoint, build, write_tokenizer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    args = parser.parse_args()
    if args.directory.exists() and any(args.directory.iterdir()):
        parser.error(f"{args.directory} exists and is not empty")
    vocab = write_tokenizer(args.directory)
    build(TinyCheckpoint("tiny", "llama", dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, bos_token_id=1, eos_token_id=2,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64})), args.directory)
    print(f"wrote {args.directory}: " + ", ".join(sorted(p.name for p in args.directory.iterdir())))


if __name__ == "__main__":
    main()
