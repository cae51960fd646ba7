"""Loading a draft: a checkpoint folder (docs/format.md) or the shipped one, placed beside its target, as one
`LoadedDraft` value: the module and what was loaded with it."""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..config import DraftConfig, check_against_target, choose_mask_token_id
from .ngrams import NgramTable, read_table
from .vocab import read_vocab
from ..cache import ContextWindow
from ..errors import InputError
from ..model.draft import DFlashDraftModel
from ..model.draft_q4 import quantize_linears
from ..model.kernels import draft_dtype
from ..model.packed import pack_module
from ..model.target import Target
from .checkpoint import read_checkpoint
from .targets import EMBEDDED_HUB_ID

SHIPPED_DRAFTS = Path(__file__).parent.parent / "drafts"
DEFAULT_DRAFT = SHIPPED_DRAFTS / "smollm2-135m-instruct"


@dataclass(frozen=True)
class LoadedDraft:
    """A draft ready to decode with: its module (on the target's device and dtype), whether it was trained (an
    untrained draft keeps the output exact, only acceptance is poor), its proposal vocabulary (decode/vocab.py:
    ids [N'] it may propose, None for all), its context window (cache.ContextWindow: None keeps every
    position) and its n-gram table (io/ngrams.py: None for none)."""

    module: DFlashDraftModel
    trained: bool = True
    vocab: torch.Tensor | None = None
    window: ContextWindow | None = None
    ngrams: NgramTable | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.module, DFlashDraftModel):
            raise InputError(f"a LoadedDraft holds a DFlashDraftModel, got {type(self.module).__name__}")
        if self.window is not None and not isinstance(self.window, ContextWindow):
            raise InputError(f"`context_window` must be a ContextWindow(window, sinks) or None, got {self.window!r}")

    @property
    def config(self) -> DraftConfig:
        return self.module.config

    def with_window(self, window: ContextWindow | None) -> LoadedDraft:
        return replace(self, window=window)


def load_draft(path: str | Path | None = None, target: Target | None = None, *, strict: bool = False,
               allow_last_layer: bool = False, full_vocab: bool = False,
               context_window: ContextWindow | None = None, ngrams: bool = True) -> LoadedDraft:
    """Load a draft folder (docs/format.md), validated against `target` when given; None loads the shipped one.

    A `blockdraft_vocab.json` beside the weights limits the ids the draft proposes (decode/vocab.py: faster,
    still exact); `full_vocab=True` ignores it. `context_window` bounds the draft's context cache to its first and
    latest positions (cache.ContextWindow: flat memory at long context, still exact); None keeps them all. A
    `blockdraft_ngrams.safetensors` beside them adds guesses from the n-gram table of the draft's training answers
    to prompt lookup (io/ngrams.py: no model cost, still exact); `ngrams=False` ignores it."""
    if context_window is not None and not isinstance(context_window, ContextWindow):
        raise InputError(f"`context_window` must be a ContextWindow(window, sinks) or None, got {context_window!r}")
    folder = Path(path) if path is not None else DEFAULT_DRAFT
    if path is None and not (folder / "config.json").is_file():
        if target is None or target.name != EMBEDDED_HUB_ID:
            raise InputError("no draft given and the shipped draft is for the embedded target only; pass --draft PATH")
        return untrained_draft(target).with_window(context_window)
    cfg, tensors = read_checkpoint(folder)
    if target is not None:
        for message in check_against_target(cfg, target.config, target.tokenizer, strict=strict,
                                            allow_last_layer=allow_last_layer):
            warnings.warn(message, stacklevel=2)
    module = DFlashDraftModel(cfg)
    module.load_state_dict(tensors, strict=True)
    vocab_size = target.lm_head.weight.shape[0] if target is not None else cfg.vocab_size
    vocab = None if full_vocab else read_vocab(folder, vocab_size)
    table = read_table(folder, vocab_size) if ngrams else None
    return place(LoadedDraft(module, True, vocab, context_window, table), target)


def untrained_draft(target: Target, num_layers: int = 2, block_size: int = 8, seed: int = 0) -> LoadedDraft:
    """A randomly initialised draft, clearly marked: output is still exact, only acceptance is poor."""
    mask = choose_mask_token_id(target.tokenizer, target.config)
    cfg = DraftConfig.for_target(target.config, num_draft_layers=num_layers, block_size=block_size, mask_token_id=mask)
    module = DFlashDraftModel(cfg)
    module.init_weights(generator=torch.Generator().manual_seed(seed))
    return place(LoadedDraft(module, trained=False), target)


def place(draft: LoadedDraft, target: Target | None) -> LoadedDraft:
    """On the target's device, in the target's dtype or float32 where bf16 is emulated (kernels.draft_dtype); its
    linears packed like the target's (model/packed.py) when it is, int4 beside an int4 target (model/draft_q4.py:
    a copy, quantized)."""
    module, vocab = draft.module, draft.vocab
    if target is not None:
        int4 = bool(target.quantized)
        module = module.to(device=target.device, dtype=draft_dtype(target.dtype, target.device, int4))
        if int4:
            module = quantize_linears(copy.deepcopy(module))
        if vocab is not None:  # once: each request's head is looked up by it
            vocab = vocab.to(target.device)
        if target.packed:
            pack_module(module)
    return replace(draft, module=module.eval(), vocab=vocab)
