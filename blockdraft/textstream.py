"""Incremental detokenisation that never emits half a character, at a cost per token that does not grow with
the text.

Byte-level tokenizers split multi-byte UTF-8 characters across tokens; decoding a prefix then yields U+FFFD.
Re-decoding the whole row at every token would cost O(n) per token, O(n^2) per answer (about 2 s of the server's
event loop for a 4,096-token answer). `TextStream` decodes a window instead: the tokens since the last emission,
after the few tokens emitted just before them as context (a tokenizer may spell a word differently at the start
of a text, as SentencePiece drops its leading space), and hands out what the new tokens add. Text that ends in
a replacement character is held back until the next token completes it (or the row ends).
"""

from __future__ import annotations


class TextStream:
    def __init__(self, tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.tokens: list[int] = []
        self.prefix = 0  # the window's first token: context already emitted, decoded again for its spelling
        self.read = 0  # tokens whose text has been handed out

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=self.skip)

    def push(self, tokens: list[int]) -> str:
        """Add tokens; return the newly complete text."""
        self.tokens.extend(tokens)
        before = self._decode(self.tokens[self.prefix: self.read])
        text = self._decode(self.tokens[self.prefix:])
        if len(text) <= len(before) or text.endswith("\ufffd"):
            return ""  # nothing new yet, or possibly an incomplete character: wait for the next token
        self.prefix, self.read = self.read, len(self.tokens)
        return text[len(before):]

    def flush(self) -> str:
        """The rest of the text at the end of the row, incomplete characters included."""
        before = self._decode(self.tokens[self.prefix: self.read])
        text = self._decode(self.tokens[self.prefix:])
        self.prefix, self.read = self.read, len(self.tokens)
        return text[len(before):]
