"""How to decode, decided once: one frozen `DecodeOptions` for the Python API, the CLI, the server and the bench.

The defaults are the best exact mode (docs/design.md §2, §8-§10): adaptive token trees with prompt-lookup runs
grafted on, at the draft's trained block size, greedy. Every caller starts from `DecodeOptions()` and changes
what its user asked for (`resolve`), so the same request decodes the same way whichever door it came in by. The
bench's methods are named presets of it (`PRESETS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from ..errors import InputError
from ..sampling import SamplingParams
from .requests import is_count
from .selection import SAMPLERS
from ..cache import ContextWindow


@dataclass(frozen=True)
class DecodeOptions:
    """block_size: K (None: the draft's trained K). tree: verify a token tree of the draft's likeliest guesses
    instead of one chain. adaptive: choose each step's width (policy.py) instead of the full block. lookup: try
    prompt-lookup continuations too (lookup.py). sampling: temperature and filters (greedy at 0) and the seed.
    sampler: "coupled" (Gumbel noise keyed by seed and position: a seed gives the target-alone sample of that
    seed), "rejection" (the draft's samples tested against p), or "auto" (coupled when seeded). draft_argmax:
    the rejection sampler proposes the draft's argmax. window: bound the draft's context memory (cache.ContextWindow;
    None: the loaded draft's own). drafting: False never runs the draft, and lookup's runs are verified on plain
    steps (what prompt lookup and the n-gram table return alone: the bench's measure of the draft's own share). Each
    choice keeps the output exact; only speed differs."""

    block_size: int | None = None
    tree: bool = True
    adaptive: bool = True
    lookup: bool = True
    sampling: SamplingParams = field(default_factory=SamplingParams)
    sampler: str = "auto"
    draft_argmax: bool = False
    window: ContextWindow | None = None
    drafting: bool = True

    def __post_init__(self) -> None:
        # Each check names the field: "off" for a flag would read as on, a float block size would crash later.
        if self.block_size is not None and not is_count(self.block_size):
            raise InputError(f"`block_size` must be a positive integer or None (the draft's own), got "
                             f"{self.block_size!r}")
        for name in ("tree", "adaptive", "lookup", "draft_argmax", "drafting"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"`{name}` must be True or False, got {getattr(self, name)!r}")
        if not isinstance(self.sampling, SamplingParams):
            raise InputError(f"`sampling` must be a SamplingParams, got {type(self.sampling).__name__}; pass "
                             "SamplingParams(temperature=..., top_p=..., seed=...)")
        if self.sampler not in SAMPLERS:
            raise InputError(f"`sampler` must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}; use auto "
                             "(coupled when seeded, rejection otherwise)")
        if not self.drafting and not self.lookup:
            raise InputError("`drafting=False` without `lookup` verifies nothing but the target's own steps; run the "
                             "target alone (no draft) or turn lookup on")
        if self.window is not None and not isinstance(self.window, ContextWindow):
            raise InputError(f"`window` must be a ContextWindow(window, sinks) or None, got {self.window!r}")

    @property
    def coupled(self) -> bool:
        """Whether sampling is coupled: asked for, or "auto" with a seed (greedy decoding is neither)."""
        greedy, seeded = self.sampling.greedy, self.sampling.seed is not None
        return not greedy and (self.sampler == "coupled" or (self.sampler == "auto" and seeded))

    def block_size_of(self, trained: int) -> int:
        """K: the block size asked for, else the draft's `trained` one."""
        return trained if self.block_size is None else self.block_size

    def describe(self) -> str:
        """The decode mode in a few words, e.g. "adaptive tree + lookup"."""
        shape = "tree" if self.tree else "chain"
        if not self.drafting:
            return "lookup alone"
        return f"{'adaptive ' if self.adaptive else ''}{shape}{' + lookup' if self.lookup else ''}"


def resolve(base: DecodeOptions | None = None, **changes) -> DecodeOptions:
    """`base` (the defaults when None) with the fields a user set; None means "not set". Unknown names are refused
    by name."""
    base = base or DecodeOptions()
    known = {f.name for f in fields(DecodeOptions)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise InputError(f"unknown decode option(s) {', '.join(unknown)}; the options are {', '.join(sorted(known))}")
    return replace(base, **{name: value for name, value in changes.items() if value is not None})


# The bench's speculative methods (bench/methods.py), from the reference algorithm to the default.
PRESETS = {
    "chain": DecodeOptions(tree=False, adaptive=False, lookup=False),  # every step verifies the full block
    "tree": DecodeOptions(tree=True, adaptive=False, lookup=False),  # a token tree of K nodes
    "adaptive": DecodeOptions(tree=True, adaptive=True, lookup=False),  # trees of 1..2K nodes
    "default": DecodeOptions(),  # adaptive trees with lookup runs grafted on
    "lookup-only": DecodeOptions(drafting=False),  # the default's lookup runs on plain steps, the draft never run
}
