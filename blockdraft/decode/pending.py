"""The draft's pending context: tapped target features the draft has not taken in yet (docs/design.md §2, §4).

Every target forward taps the features of the positions it commits; the draft takes them into its context cache
only at its next drafted step (`Drafter.append_context`). Until then they wait here, per row: row b's first
counts[b] entries of a [B, P, F] buffer (F = L*D, the tapped layers' widths side by side), the rest padding.

`Pending` keeps them for a DecodeState. A plain step (one committed token per row) only adds its features to a
short tail; the tail is joined into the buffer when someone reads the features (a drafted step, rows leaving or
joining) or when it reaches `TAIL_LIMIT` steps, so a batch that runs plain steps for a long time pays one join per
`TAIL_LIMIT` steps instead of one per step.
"""

from __future__ import annotations

import torch

# Plain steps whose features wait in the tail before they are joined into the buffer: one join (a few tens of
# microseconds on a CPU) every this many steps instead of every step, and a bounded list.
TAIL_LIMIT = 64


class Pending:
    """Rows' pending features [B, P, F] and their counts [B]; `features` may be None for a drafter that taps
    nothing (a test double), with counts still kept."""

    def __init__(self, features: torch.Tensor | None, counts: torch.Tensor) -> None:
        self._features, self._counts = features, counts
        self._tail: list[torch.Tensor | None] = []  # plain steps' features, [B, 1, F] each

    @property
    def features(self) -> torch.Tensor | None:
        """[B, P, F], the plain steps' tail joined in."""
        self._join_tail()
        return self._features

    @property
    def counts(self) -> torch.Tensor:
        """[B] real entries per row."""
        self._join_tail()
        return self._counts

    def add(self, features: torch.Tensor | None, counts: torch.Tensor) -> None:
        """Append row b's first counts[b] entries of features [B, Q, F] (a step's committed positions)."""
        self._join_tail()
        self._features, self._counts = join_pending(self._features, self._counts, features, counts)

    def add_plain(self, features: torch.Tensor | None) -> None:
        """Append a plain step's features [B, 1, F] (one committed position per row), joined later."""
        self._tail.append(features)
        if len(self._tail) >= TAIL_LIMIT:
            self._join_tail()

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep rows [B'] (in that order), cut to the longest kept row's entries."""
        self._join_tail()
        self._counts = self._counts[rows]
        if self._features is not None:
            self._features = self._features[rows, : pending_width(self._counts)]

    def stack(self, other: "Pending") -> None:
        """Append other's rows after these (`stack_pending`)."""
        self._features, self._counts = stack_pending(self.features, self.counts, other.features, other.counts)

    def _join_tail(self) -> None:
        if not self._tail:
            return
        tail, self._tail = self._tail, []
        new = None if any(f is None for f in tail) else torch.cat(tail, dim=1)  # [B, T, F]
        self._features, self._counts = join_pending(self._features, self._counts, new,
                                                    torch.full_like(self._counts, len(tail)))


def join_pending(old: torch.Tensor | None, old_counts: torch.Tensor, new: torch.Tensor | None,
                 new_counts: torch.Tensor):
    """Append row b's first new_counts[b] entries of new [B, Q, F] after its first old_counts[b] entries of
    old [B, P, F] -> ([B, P+Q, F], old_counts + new_counts). Entries past a row's count are padding (zeros where
    nothing was written).

    While the draft sits out (plain steps), the tail appends its positions: copying all P positions each time
    would cost O(P) a join. The result is a view of a buffer with room to spare (`pending_room`), into which
    the next call writes in place while it has room, so appending costs O(Q), amortized."""
    if old is None or new is None:  # a drafter that taps no features (a test double): only counts to keep
        return None, old_counts + new_counts
    B, P, F = old.shape
    Q = new.shape[1]
    room = pending_room(old)
    if room >= P + Q:
        out = old.as_strided((B, P + Q, F), old.stride())  # the same buffer, P+Q of its positions
    else:
        room = max(2 * (P + Q), 64)
        buffer = old.new_zeros(B, room, F)  # [B, room, F]
        buffer[:, :P] = old
        out = buffer[:, : P + Q]
    out.pending_room = room  # this view's buffer, for the next join (plain tensors have no such attribute)
    if B == 1 and out.device.type == "cpu":  # one row: a slice copy, a fifth of a scatter's cost here
        out[0].narrow(0, int(old_counts[0]), Q).copy_(new[0])
    else:
        where = old_counts[:, None] + torch.arange(Q, device=old.device)  # [B, Q]: right after each row's entries
        # Indexed assignment, not scatter_ along dim 1: on the strided view of a CPU buffer scatter_ took 0.38 ms
        # for 8 rows of one 1152-wide position (Zen 5), 30x this, and a plain step of the int4 target is 3.6 ms.
        rows = torch.arange(B, device=old.device)[:, None]  # [B, 1]
        out[rows, where] = new.to(old.dtype)
    return out, old_counts + new_counts


def pending_room(pending: torch.Tensor) -> int:
    """Positions that pending [B, P, F] can grow to in place: the room of the buffer that join_pending made it a
    view of, else exactly P (any other tensor, e.g. a step's features or rows kept by indexing)."""
    return getattr(pending, "pending_room", pending.shape[1])


def stack_pending(a: torch.Tensor | None, a_counts: torch.Tensor, b: torch.Tensor | None, b_counts: torch.Tensor):
    """Rows of pending features a [A, P, F] then b [B, Q, F] -> ([A+B, W, F], counts), W the most entries of a row.

    Plain steps widen the buffer by a position each while rows come and go (join_pending), so a batch that runs
    plain for as long as a server is busy would grow it without end if row changes did not cut it back."""
    counts = torch.cat([a_counts, b_counts])
    if a is None or b is None:  # a drafter that taps no features (a test double): only counts to keep
        return None, counts
    width = pending_width(counts)
    pad = [x[:, :width] if x.shape[1] >= width else
           torch.cat([x, x.new_zeros(x.shape[0], width - x.shape[1], x.shape[2])], 1) for x in (a, b.to(a.dtype))]
    return torch.cat(pad), counts


def pending_width(counts: torch.Tensor) -> int:
    """The most pending entries of a row, from counts [B] (0 for no rows)."""
    return int(counts.max()) if counts.numel() else 0
