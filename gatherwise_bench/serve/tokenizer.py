"""A local byte-level BPE tokenizer with exactly the model's vocabulary size, built without a hub or a corpus.

Its vocabulary is enumerated rather than trained: the three specials, the 256 byte symbols, then space-prefixed
letter words of growing length (" a", " ab", " abc", ...) in order, each with the merge (word minus its last letter,
last letter). Why not train one: a BPE needs a corpus with ~150k distinct merges to reach Qwen2.5's vocabulary,
and why not pad a small one with added tokens: transformers then takes ~20 s to load it in every engine process.
Every word id decodes to printable text that re-encodes to it (a random-weight model emits word ids 99.8 % of the
time at vocab 151936); the 128 single-byte ids above 0x7F decode to U+FFFD on their own, like any byte-level BPE's.
"""

from __future__ import annotations

import itertools
import json
import string
from collections.abc import Iterator
from pathlib import Path

SPECIAL = ["<unk>", "<s>", "</s>"]
WORD_START = "\u0120"  # the byte-level alphabet's symbol for a space
LETTERS = string.ascii_letters


def _words() -> Iterator[str]:
    """Space-prefixed letter words, all of length 1, then all of length 2, ...: each word's prefix came first."""
    for length in itertools.count(1):
        for letters in itertools.product(LETTERS, repeat=length):
            yield WORD_START + "".join(letters)


def write_tokenizer(directory: Path, vocab_size: int) -> None:
    """tokenizer.json and tokenizer_config.json in `directory` with ids 0..vocab_size-1 (BOS `<s>` added by the
    post-processor, EOS `</s>`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate(SPECIAL + alphabet)}
    if vocab_size < len(vocab) + len(LETTERS):
        raise ValueError(f"vocab_size must be at least {len(vocab) + len(LETTERS)}, got {vocab_size}")
    merges = []
    for word in itertools.islice(_words(), vocab_size - len(vocab)):
        vocab[word] = len(vocab)
        merges.append((word[:-1], word[-1]))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", vocab["<s>"])])
    tok.add_special_tokens(SPECIAL)
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size(with_added_tokens=True)} ids, wanted {vocab_size}")
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": 32768}))
