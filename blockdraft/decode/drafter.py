"""The draft side of a decode step: the draft model, its context cache, and the target's embedding and head.

Shapes: B rows, P pending context positions, K block size, D hidden, L tapped layers, V vocabulary.
"""

from __future__ import annotations

import torch

from ..cache import KVCache
from ..errors import InputError
from ..io.drafts import LoadedDraft
from ..model.draft import DFlashDraftModel
from ..model.draft_lean import lean_draft
from ..model.draft_q4 import is_int4
from ..model.packed import head_linear
from ..model.target import Target
from .tree import top_candidates
from .vocab import prompt_only_ids, scatter_logits
from ..cache import ContextWindow


def padded_rows(counts: torch.Tensor, width: int) -> torch.Tensor:
    """Boolean [B, width]: True for the first counts[b] entries of row b."""
    return torch.arange(width, device=counts.device)[None, :] < counts[:, None]


class Drafter:
    """Proposes K-1 tokens per row from the anchor and the target's tapped features.

    The context cache holds the draft's keys/values of every committed position that has already been
    fed in; `propose` first appends the pending positions (those the target committed since the last
    call) and then runs the block, whose own keys/values are never stored.
    """

    def __init__(self, draft: LoadedDraft | DFlashDraftModel, target: Target, block_size: int | None = None,
                 window: ContextWindow | None = None) -> None:
        draft = LoadedDraft(draft) if isinstance(draft, DFlashDraftModel) else draft
        self.draft = draft.module
        # Its dtype: the target's, or float32 beside a bf16 target where bf16 is emulated (kernels.draft_dtype);
        # features and embeddings come in the target's and are cast, its rows go to a head in its own dtype.
        self.dtype = self.draft.hidden_norm.weight.dtype
        self.int4 = is_int4(self.draft)  # its products int4 (model/draft_q4.py), and then its head rows too
        self.lean = lean_draft(self.draft)  # its inference forward with fewer ops, the same bits
        self.target = target
        self.config = draft.config
        self.block_size = draft.config.block_size if block_size is None else int(block_size)
        self.cache: KVCache | None = None
        # Bounded context (cache.ContextWindow): by default the loaded draft's; None keeps every position.
        self.window = draft.window if window is None else window
        if self.window is not None and not isinstance(self.window, ContextWindow):
            raise InputError(f"the draft's context window must be a ContextWindow(window, sinks) or None, got "
                             f"{self.window!r}")
        self.seen: torch.Tensor | None = None  # [B] context positions fed in so far (the cache keeps some of them)
        # The proposal vocabulary (vocab.py): ids [N] the draft may propose, None for all of them. Each request
        # adds its prompts' ids. The target keeps the head over it by the ids' storage (row_head): load_draft puts
        # it on the target's device once, so every request of a GPU server finds the same head (`.to` here copies
        # only when needed).
        self.vocab = None if draft.vocab is None else draft.vocab.to(target.device)
        self.ngrams = draft.ngrams  # its n-gram table (ngrams.py), or None: guesses for prompt lookup's blanks
        self.active_ids: torch.Tensor | None = None  # [N'] this request's ids: the vocabulary's, then its prompts'
        self._extra_head = None  # `extra_head`, once built
        self.head = None  # rows [..., D] -> their logits over active_ids [..., N'] (packed like the target's)

    @property
    def trained_block_size(self) -> int:
        return self.config.block_size

    @property
    def tap_layer_ids(self) -> tuple[int, ...]:
        return tuple(self.config.target_layer_ids)

    def start(self, batch: int, capacity: int, prompts: list[list[int]] | None = None) -> None:
        self.cache = self._new_cache(batch, capacity)
        self.seen = torch.zeros(batch, dtype=torch.long, device=self.target.device)
        if self.vocab is not None:
            self.active_ids = self.vocab  # [N'] = [N + E]: the vocabulary's ids, then the prompts' ids it lacks
            self.head = self.target.row_head(self.vocab, self.dtype, int4=self.int4)  # built once per vocabulary
            self._extra_head = None
            self._add_prompt_ids(prompts or [])

    def add_rows(self, prompts: list[list[int]]) -> None:
        """Rows joining a running decode (their context comes as pending features, like any prompt's)."""
        self.cache.add_rows(self._new_cache(len(prompts), self.cache.capacity))
        self.seen = torch.cat([self.seen, self.seen.new_zeros(len(prompts))])
        if self.vocab is not None:
            self._add_prompt_ids(prompts)

    def _new_cache(self, batch: int, capacity: int) -> KVCache:
        """A context cache of `capacity` slots, or of the window's (a fixed size, whatever the context) when bounded."""
        cfg = self.config
        slots = capacity if self.window is None else self.window.capacity
        return KVCache(cfg.num_hidden_layers, batch, cfg.num_key_value_heads, slots, cfg.head_dim,
                       self.dtype, self.target.device)

    def _add_prompt_ids(self, prompts: list[list[int]]) -> None:
        """Let the draft propose the prompts' ids that the vocabulary lacks (a few rows: gathered, not packed)."""
        extra = prompt_only_ids(self.active_ids, prompts) if prompts else self.active_ids[:0]  # [E'] new ones
        if not extra.numel():
            return
        self.active_ids = torch.cat([self.active_ids, extra])
        self._extra_head = None  # built again, over every extra id, when the draft next runs

    @property
    def extra_head(self):
        """rows [..., D] -> logits over the prompts' ids outside the vocabulary [..., E], or None when there are
        none. Built when the draft first runs for these ids: a request whose steps all run plain (a draft under
        the break-even) never pays for it (about 5 ms at q4, whose rows are read from the file)."""
        if self.vocab is None or self.active_ids is None or self.active_ids.numel() == self.vocab.numel():
            return None
        if self._extra_head is None:
            extra = self.active_ids[self.vocab.numel():]  # every extra id of the request, in active_ids' order
            head = self.target.lm_head
            bias = None if getattr(head, "bias", None) is None else head.bias.detach()[extra]
            self._extra_head = head_linear(self.target.head_rows(extra).to(self.dtype), bias, pack=False)
        return self._extra_head

    def keep_rows(self, rows: torch.Tensor) -> None:
        self.cache.keep_rows(rows)
        self.seen = self.seen[rows]

    def append_context(self, features: torch.Tensor, counts: torch.Tensor) -> None:
        """Feed pending features [B, P, L*D] (the first counts[b] rows of each row are real) into the cache.

        Row b's pending features are positions seen[b] .. seen[b] + counts[b] - 1. Padding entries are written to
        slots past the new length, where they stay masked until overwritten. With a window (cache.ContextWindow) each
        position goes to its ring slot, and what the window does not keep to a slot that is never read.
        """
        start = self.seen  # [B]
        positions = start[:, None] + torch.arange(features.shape[1], device=features.device)  # [B, P]
        total = start + counts
        if self.window is None:
            slots, lengths = positions.clamp(max=self.cache.capacity - 1), total
        else:
            valid = padded_rows(counts, features.shape[1])
            slots, lengths = self.window.slots(positions, valid, total), self.window.lengths(total)
        ctx = self.lean.project_context(features.to(self.dtype))  # [B, P, D]
        start = KVCache.contiguous_start(slots) if self.window is None else None  # a slice copy where it can
        for layer, (k, v) in enumerate(self.lean.context_kv(ctx, positions)):
            self.cache.write(layer, k, v, slots, start)
        self.cache.crop_to(lengths)
        self.seen = total

    def _logits(self, anchors: torch.Tensor, anchor_positions: torch.Tensor, slots: int | None = None):
        """Draft logits float32 for block slots 1..n (n = `slots`, default K-1), given anchors [B] at positions
        [B] -> (logits [B, n, V] and None, or logits [B, n, N'] over the proposal vocabulary and its ids [N']).
        The draft always runs the whole block, as trained; only the LM head, a third of the forward at one
        slot (q4), is limited to the slots that will be verified. A block cut to those slots saved a tenth of the
        forward and cost a sixth of the first slot's acceptance on HumanEval (0.52 against 0.62;
        benchmarks/results/2026-12-06-stage19/).

        The context cache must already hold positions 0..anchor_position-1 of every row.
        """
        K = self.block_size
        cfg = self.config
        B = anchors.shape[0]
        block = torch.full((B, K), cfg.mask_token_id, dtype=torch.long, device=anchors.device)
        block[:, 0] = anchors  # [anchor, MASK x (K-1)]
        positions = anchor_positions[:, None] + torch.arange(K, device=anchors.device)  # [B, K]
        span = int(self.cache.lengths.max())
        ctx_visible = padded_rows(self.cache.lengths, span)  # [B, span]: hide each row's padding
        # Non-causal: every block row sees all of its row's context and the whole block.
        mask = torch.cat([ctx_visible, ctx_visible.new_ones(B, K)], dim=1)[:, None, :].expand(B, K, span + K)
        ctx_kv = [self.cache.read(layer, span) for layer in range(cfg.num_hidden_layers)]
        embedded = self.target.embed_tokens(block).to(self.dtype)  # [B, K, D]
        hidden = self.lean.forward(embedded, positions, ctx_kv, mask)  # [B, K, D]
        # Slot 0 (the anchor) predicts nothing: the LM head runs on slots 1..n only.
        rows = hidden[:, 1: K if slots is None else 1 + slots]  # [B, n, D]
        if self.head is None:
            return self._softcap(self.target.logits(rows.to(self.target.dtype))), None
        # Scored over the proposal vocabulary only [B, n, N'] (its ids: active_ids, the vocabulary's then the extra).
        logits = self.head(rows)
        extra_head = self.extra_head
        if extra_head is not None:
            logits = torch.cat([logits, extra_head(rows)], dim=-1)
        return self._softcap(logits.float()), self.active_ids

    def propose(self, anchors: torch.Tensor, anchor_positions: torch.Tensor, slots: int | None = None) -> torch.Tensor:
        """Draft logits [B, n, V] float32 for block slots 1..n (n = `slots`, default K-1), given anchors [B] at
        positions [B]; -inf outside the proposal vocabulary. See `_logits`."""
        logits, ids = self._logits(anchors, anchor_positions, slots)
        return logits if ids is None else scatter_logits(logits, ids, self.target.lm_head.weight.shape[0])

    def propose_top(self, anchors: torch.Tensor, anchor_positions: torch.Tensor, slots: int, top_k: int,
                    score=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Each slot's top_k tokens and their scores (a token tree's candidates, tree.py): [B, n, k] each, best
        first. The scores are the draft's log-probs, normalised over the proposal vocabulary, where q lives,
        without widening to V; or `score(logits [B, n, V or N'], ids [N'] or None, vocab_size)` when given (coupled
        sampling ranks by log q + g; Selector.draft_scores)."""
        logits, ids = self._logits(anchors, anchor_positions, slots)
        vocab_size = self.target.lm_head.weight.shape[0]
        scores = logits.log_softmax(dim=-1) if score is None else score(logits, ids, vocab_size)
        scores, index = top_candidates(scores, top_k)
        return scores, index if ids is None else ids[index]

    def _softcap(self, logits: torch.Tensor) -> torch.Tensor:
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap
