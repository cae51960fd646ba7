"""Exactness on the embedded default target: SmolLM2-135M-Instruct with the shipped draft, in float32."""

from __future__ import annotations

import pytest

from step_fakes import proposer
from tiny_models import needs_smollm2

pytestmark = needs_smollm2

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain in three sentences why the sky is blue.",
    "Give me a short recipe for pancakes.",
    "What are the main differences between a list and a tuple in Python?",
    "Write a haiku about autumn leaves.",
]


@pytest.fixture(scope="module")
def smollm2():
    from blockdraft import load_draft, load_target

    target = load_target(dtype="float32")
    return target, load_draft(target=target)


def test_speculative_greedy_equals_target_greedy_on_smollm2(smollm2):
    from blockdraft.api import encode
    from blockdraft.decode.generate import generate
    from blockdraft.decode.proposers import TargetAlone

    target, draft = smollm2
    prompts = [encode(target, p) for p in PROMPTS]
    base = generate(target, TargetAlone(), prompts, max_new_tokens=128, stop_token_ids=[])
    spec = generate(target, proposer(target, draft), prompts, max_new_tokens=128, stop_token_ids=[])
    for text, b, s in zip(PROMPTS, base, spec):
        assert len(b.tokens) == 128
        assert s.tokens == b.tokens, f"speculative output differs from the target's own for {text!r}"


def test_embedded_target_shape(smollm2):
    target, _ = smollm2
    assert (target.num_layers, target.config.hidden_size, target.config.vocab_size) == (30, 576, 49152)
    assert target.lm_head.weight.data_ptr() == target.embed_tokens.weight.data_ptr(), "tied embeddings"
