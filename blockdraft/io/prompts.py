"""Prompt token ids: chat messages through the target's chat template, ready for the assistant's turn."""

from __future__ import annotations


def encode_prompt(tokenizer, messages) -> list[int]:
    """Chat-template the messages, ready for the assistant's turn."""
    ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)
