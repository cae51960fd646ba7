"""A quick first start: the step costs are measured bucket by bucket after the server starts listening.

Adaptive widths price their steps with a cost model measured once per machine (decode/costs.py; minutes on a
2-core CPU the first time, then read from the disk cache). The server listens at once and `/health` answers
"warming" (503) while the worker thread measures the smallest batch-size bucket; requests that arrive meanwhile
wait in the bounded queue. From then on the worker alternates: one batch of at most the rows measured so far,
then the next bucket (1, 2, 4, ... rows up to `--max-batch`), until every bucket is known.

Why the text is the same as on a server that was warm from the start: a decode of at most r rows asks the cost
model only about batches of at most r rows, and the worker lets a batch grow to r rows only once every bucket up
to r's is measured. For those row counts the partial model gives exactly the answers of the full one (a later
bucket adds its own table and changes no other), so every width choice is the one the warm server makes, and
nothing is decided from the clock. What warming changes is only how requests are grouped into batches, which on
a warm server already depends on when requests arrive (docs/design.md §14: in float32 a row's tokens do not
depend on its batch; in bf16 its prefill does not either, but a decode step's attention may still round a
near-tie apart, warm or not).
"""

from __future__ import annotations

from ..decode.costs import batch_bucket
from ..decode.decoder import Decoder


class Warmup:
    """The batch sizes whose step costs are known, grown one bucket at a time (`next`, in the worker thread)."""

    def __init__(self, decoder: Decoder, max_batch: int) -> None:
        self.decoder = decoder
        # One step per bucket, the last capped at max_batch: 6 rows -> 1, 2, 4, 6 (bucket 8 priced by its 6).
        self.steps = [min(1 << i, max_batch) for i in range(batch_bucket(max_batch).bit_length())]
        self.rows = 0  # the most rows a batch may have now: every bucket up to theirs is measured
        self.error: str | None = None  # why measuring failed, for /health

    @property
    def done(self) -> bool:
        return self.rows == self.steps[-1]

    def next(self) -> None:
        """Measure (or read from the cache) the costs of the next bucket; a batch may then have that many rows."""
        rows = self.steps[self.steps.index(self.rows) + 1 if self.rows else 0]
        self.decoder.costs(rows)  # measures only the buckets not yet known, and caches them on disk
        self.rows = rows
