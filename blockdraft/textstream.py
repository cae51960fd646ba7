"""Incremental detokenisation that never emits half a character.

Byte-level tokenizers split multi-byte UTF-8 characters across tokens; decoding a prefix then yields
U+FFFD. `TextStream` re-decodes the row's tokens and emits only the new text that is complete, holding a
trailing replacement character back until the next token completes it (or the row ends).
"""

from __future__ import annotations


class TextStream:
    def __init__(self, tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.tokens: list[int] = []
        self.emitted = 0  # characters of the decoded text already handed out

    def push(self, tokens: list[int]) -> str:
        """Add tokens; return the newly complete text."""
        self.tokens.extend(tokens)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=self.skip)
        end = len(text)
        while end > self.emitted and text[end - 1] == "\ufffd":
            end -= 1  # possibly an incomplete character: wait for the next token
        new, self.emitted = text[self.emitted:end], max(self.emitted, end)
        return new

    def flush(self) -> str:
        """The rest of the text at the end of the row, incomplete characters included."""
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=self.skip)
        new, self.emitted = text[self.emitted:], len(text)
        return new
