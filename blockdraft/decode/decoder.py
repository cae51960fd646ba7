"""One decoder for every door: the Python API, `generate`, `chat`, `serve`, `bench`, `eval` and `data` all decode
through a `Decoder` (a target, its draft or none, and the `DecodeOptions` its requests start from).

A request may change the options (`options=`); the Decoder builds the selector and the draft's runner for them,
and prices adaptive widths with the cost model of this target and draft (costs.py), measured once, so that the
same request gives the same tokens every time (docs/design.md §14).
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

from ..io.drafts import LoadedDraft
from ..metrics import AcceptanceStats
from ..model.draft import DFlashDraftModel
from ..model.target import Target
from .costs import CostModel
from .generate import Admission, GenerationResult, StreamEvent, as_drafter, generate, measured_costs, stream
from .options import DecodeOptions
from .selection import Selector


class Decoder:
    """Decodes token-id prompts with `target` and `draft` (None: the target alone, the exactness oracle).

    `costs` fixes the step-cost model instead of measuring it (tests; a model measured elsewhere);
    `measure_costs` measures it again instead of reading the cached one (after a first run on a busy machine)."""

    def __init__(self, target: Target, draft: LoadedDraft | DFlashDraftModel | None,
                 options: DecodeOptions | None = None, *, costs: CostModel | None = None,
                 measure_costs: bool = False) -> None:
        self.target = target
        self.draft = LoadedDraft(draft) if isinstance(draft, DFlashDraftModel) else draft
        self.options = options or DecodeOptions()
        self.fixed_costs, self.measure_costs = costs, measure_costs
        self._drafters: dict = {}  # (block size, window) -> Drafter, restarted by every decode

    @property
    def speculative(self) -> bool:
        return self.draft is not None

    def block_size(self, options: DecodeOptions | None = None) -> int:
        """K of a request with `options` (1 for the target alone)."""
        options = options or self.options
        if self.draft is None:
            return 1
        if options.block_size is not None:
            return options.block_size
        # A Drafter-like object (a test double) carries its own block size.
        return self.draft.config.block_size if isinstance(self.draft, LoadedDraft) else self.draft.block_size

    def drafter(self, options: DecodeOptions):
        """The draft's runner at the options' block size and window (None for the target alone)."""
        if self.draft is None:
            return None
        key = (options.block_size, options.window)
        if key not in self._drafters:
            draft = self.draft if options.window is None else self.draft.with_window(options.window)
            self._drafters[key] = as_drafter(self.target, draft, options.block_size)
        return self._drafters[key]

    def costs(self, rows: int, options: DecodeOptions | None = None) -> CostModel | None:
        """The step costs at batch sizes up to `rows` for `options` (None when nothing adapts: no model is needed).
        Measured once per target, draft, dtype, device and threads, and cached (costs.py)."""
        options = options or self.options
        if self.draft is None or self.block_size(options) < 2 or not (options.adaptive or options.lookup):
            return None
        if self.fixed_costs is not None:
            return self.fixed_costs
        return measured_costs(self.target, self.drafter(options), options.tree, rows, fresh=self.measure_costs)

    def selector(self, rows: int, options: DecodeOptions, seeds: list[int | None] | None = None) -> Selector:
        """Greedy or sampled selection for `rows` rows: row i seeded with seeds[i], or the options' seed + i."""
        return Selector(options.sampling, num_rows=rows, draft_argmax=options.draft_argmax, seeds=seeds,
                        coupled=options.coupled)

    def stream(self, prompts: list[list[int]], *, max_new_tokens=256, options: DecodeOptions | None = None,
               stop_token_ids=None, seeds: list[int | None] | None = None,
               stats: list[AcceptanceStats] | None = None, drop: Callable[[], Iterable[int]] | None = None,
               admit: Callable[[int], list[Admission]] | None = None, room: int | None = None,
               max_rows: int | None = None) -> Iterator[StreamEvent]:
        """Decode token-id prompts as one batch and yield tokens as rows commit them (generate.stream: `drop`,
        `admit` and `room` serve continuous batching). `max_rows`: the most rows the decode may grow to with
        `admit`, so that their step costs are known from the start."""
        options = options or self.options
        rows = max(len(prompts), max_rows or 0)
        return stream(self.target, self.drafter(options), prompts, max_new_tokens=max_new_tokens,
                      block_size=options.block_size, stop_token_ids=stop_token_ids,
                      selector=self.selector(len(prompts), options, seeds), stats=stats,
                      adaptive=options.adaptive, lookup=options.lookup, tree=options.tree, drop=drop, admit=admit,
                      room=room, costs=self.costs(rows, options))

    def generate(self, prompts: list[list[int]], *, max_new_tokens=256, options: DecodeOptions | None = None,
                 stop_token_ids=None, on_tokens: Callable[[int, list[int]], None] | None = None
                 ) -> list[GenerationResult]:
        """Decode every prompt to completion as one batch; one GenerationResult per prompt, in order, each with
        its statistics. `on_tokens(row, tokens)` sees the tokens as they are committed (streaming output)."""
        options = options or self.options
        return generate(self.target, self.drafter(options), prompts, max_new_tokens=max_new_tokens,
                        block_size=options.block_size, stop_token_ids=stop_token_ids,
                        selector=self.selector(len(prompts), options), adaptive=options.adaptive,
                        lookup=options.lookup, tree=options.tree, costs=self.costs(len(prompts), options),
                        on_tokens=on_tokens)
