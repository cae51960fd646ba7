"""Stop strings: cut the generated text before the first one, never sending part of one to the client.

Text arrives in pieces, so a stop string can be split across them ("</" then "end>"). `StopStrings` sends the
text it can prove is not the start of a stop string and holds the rest back until the next piece decides it:
with stop "</end>", the text "a </" sends "a " and holds "</".
"""

from __future__ import annotations


class StopStrings:
    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.pending = ""  # received but not yet sent: possibly the start of a stop string
        self.hit = False  # a stop string was found; nothing more is sent

    def push(self, text: str) -> str:
        """Add newly decoded text; return the part that can be sent now."""
        if self.hit:
            return ""
        self.pending += text
        found = [i for i in (self.pending.find(stop) for stop in self.stops) if i >= 0]
        if found:
            self.hit = True
            return self.pending[: min(found)]
        held = max((self._partial(stop) for stop in self.stops), default=0)
        out, self.pending = self.pending[: len(self.pending) - held], self.pending[len(self.pending) - held:]
        return out

    def flush(self) -> str:
        """At the end of the row: the held-back text, which never completed a stop string."""
        out, self.pending = ("" if self.hit else self.pending), ""
        return out

    def _partial(self, stop: str) -> int:
        """Length of the longest end of `pending` that is a proper beginning of `stop` (0 if none)."""
        for n in range(min(len(stop) - 1, len(self.pending)), 0, -1):
            if self.pending.endswith(stop[:n]):
                return n
        return 0
