"""One decoder for every door: the Python API, `generate`, `chat`, `serve`, `bench`, `eval` and `data` all decode
through a `Decoder` (a target, its draft or none, and the `DecodeOptions` its requests start from).

A request may change the options (`options=`). For each decode the Decoder builds what the options ask for: the
draft's runner (drafter.py), the step costs (measured once, measure.py), the width policy (policy.py), the prompt
lookup with the draft's n-gram table (lookup.py), and the proposer that joins them (proposers.py); the engine
(generate.py) then loops the step over it. The same request gives the same tokens every time (docs/design.md §14).
"""

from __future__ import annotations

import weakref
from typing import Callable, Iterable, Iterator

from ..checks import check_against_target
from ..errors import InputError
from ..io.drafts import LoadedDraft
from ..metrics import AcceptanceStats
from ..model.draft import DFlashDraftModel
from ..model.kernels import draft_dtype
from ..model.target import Target
from .costs import CostModel
from .drafter import Drafter
from .generate import Admission, GenerationResult, StreamEvent, generate, stream
from .lookup import PromptLookup
from .measure import measured_costs
from .options import DecodeOptions
from .policy import make_policy
from .proposers import ChainProposer, Proposer, TargetAlone, TreeProposer
from .selection import Selector


class Decoder:
    """Decodes token-id prompts with `target` and `draft` (None: the target alone, the exactness oracle; a
    Drafter-like object: used as is, tests' scripted drafts).

    `costs` fixes the step-cost model instead of measuring it (tests; a model measured elsewhere);
    `measure_costs` measures it again instead of reading the cached one (after a first run on a busy machine)."""

    def __init__(self, target: Target, draft: LoadedDraft | DFlashDraftModel | Drafter | None,
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
        if self.draft is None:
            return 1
        # A Drafter-like object (a test double) carries its own block size.
        trained = self.draft.config.block_size if isinstance(self.draft, LoadedDraft) else self.draft.block_size
        return (options or self.options).block_size_of(trained)

    def drafter(self, options: DecodeOptions | None = None):
        """The draft's runner at the options' block size and window (None for the target alone)."""
        options = options or self.options
        if self.draft is None:
            return None
        key = (options.block_size, options.window)
        if key not in self._drafters:
            draft = self.draft if options.window is None else self.draft.with_window(options.window)
            self._drafters[key] = as_drafter(self.target, draft, options.block_size)
        return self._drafters[key]

    def costs(self, rows: int, options: DecodeOptions | None = None) -> CostModel | None:
        """The step costs at batch sizes up to `rows` for `options` (None when nothing adapts: no model is needed).
        Measured once per target, draft, dtype, device and threads, and cached (measure.py)."""
        options = options or self.options
        if self.draft is None or self.block_size(options) < 2 or not (options.adaptive or options.lookup):
            return None
        if self.fixed_costs is not None:
            return self.fixed_costs
        return measured_costs(self.target, self.drafter(options), options.tree, rows, fresh=self.measure_costs)

    def proposer(self, rows: int, options: DecodeOptions | None = None) -> Proposer:
        """A fresh proposer for one decode of up to `rows` rows: the target alone, or the draft's chain or tree at
        the full block or adaptive widths, with prompt lookup (and the draft's n-gram table) where asked."""
        options = options or self.options
        drafter = self.drafter(options)
        if drafter is None:
            return TargetAlone()
        K = drafter.block_size
        if K < 2:  # nothing to guess: the draft's block is its anchor
            return ChainProposer(drafter, make_policy(K, False))
        costs = self.costs(rows, options)
        lookup = PromptLookup(K, costs, table=getattr(drafter, "ngrams", None)) if options.lookup else None
        policy = make_policy(K, options.adaptive, costs, options.tree, options.drafting)
        if options.tree:
            return TreeProposer(drafter, policy, lookup, int(self.target.lm_head.weight.shape[0]))
        return ChainProposer(drafter, policy, lookup, int(self.target.lm_head.weight.shape[0]))

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
        proposer = self.proposer(max(len(prompts), max_rows or 0), options)
        return stream(self.target, proposer, prompts, max_new_tokens=max_new_tokens, stop_token_ids=stop_token_ids,
                      selector=self.selector(len(prompts), options, seeds), stats=stats, drop=drop, admit=admit,
                      room=room)

    def generate(self, prompts: list[list[int]], *, max_new_tokens=256, options: DecodeOptions | None = None,
                 stop_token_ids=None, seeds: list[int | None] | None = None,
                 on_tokens: Callable[[int, list[int]], None] | None = None) -> list[GenerationResult]:
        """Decode every prompt to completion as one batch; one GenerationResult per prompt, in order, each with
        its statistics. `on_tokens(row, tokens)` sees the tokens as they are committed (streaming output)."""
        options = options or self.options
        proposer = self.proposer(len(prompts), options)  # costs are measured (once) before the clock starts
        return generate(self.target, proposer, prompts, max_new_tokens=max_new_tokens,
                        stop_token_ids=stop_token_ids, selector=self.selector(len(prompts), options, seeds),
                        on_tokens=on_tokens)


def as_drafter(target: Target, draft, block_size: int | None):
    """A loaded draft (or a bare draft module) becomes a Drafter at the requested block size; a Drafter-like
    object passes through.

    A draft is checked against the target first (once per pair): its shape and interface (docs/format.md), and
    that it lies on the target's device in the dtype it runs in beside it (kernels.draft_dtype), as
    `load_draft(path, target)` places it."""
    if isinstance(draft, DFlashDraftModel):
        draft = LoadedDraft(draft)
    if not isinstance(draft, LoadedDraft):
        return draft
    if _CHECKED.get(draft.module) is not target:
        # The last-layer id is a portability rule of load_draft (docs/format.md §3.1); this loop taps it as HF does.
        check_against_target(draft.config, target.config, allow_last_layer=True)
        weight = draft.module.hidden_norm.weight
        dtype = draft_dtype(target.dtype, target.device, bool(target.quantized))
        if (weight.device, weight.dtype) != (target.device, dtype):
            raise InputError(f"the draft's weights are {str(weight.dtype).removeprefix('torch.')} on {weight.device} "
                             f"but beside this target it runs {str(dtype).removeprefix('torch.')} on {target.device}; "
                             "load the draft with load_draft(path, target), which places it beside the target")
        _CHECKED[draft.module] = target
    return Drafter(draft, target, block_size)


_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # draft module -> the target it was checked with
