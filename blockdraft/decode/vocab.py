"""The draft's proposal vocabulary: which token ids the draft's LM head scores (a speed option, never exactness).

The draft shares the target's LM head, a [V, D] matrix that costs as much to apply as the rest of the draft
together (SmolLM2: 49152 x 576). A target's own responses use a small part of V (SmolLM2 emits under 10k
distinct ids over 250k training tokens), so the draft can score only those, plus every id of the request's
prompts (names and numbers copied from the prompt). Ids outside get logit -inf: the draft never proposes
them, and the target still verifies every proposal, so greedy output stays the target's own and sampling
stays exact (the rejection test uses the same q the proposal was drawn from, zero outside the vocabulary).
Only acceptance can change, where the target emits an id the draft could not propose.

The list lives beside a draft as `blockdraft_vocab.json` (io/vocab.py), a sidecar that other engines never read:
docs/format.md keeps the weights and config.json free of any draft vocabulary (`d2t` is refused there).

Shapes: V target vocabulary, N ids in the draft vocabulary, D hidden.
"""

from __future__ import annotations


import torch


def prompt_only_ids(ids: torch.Tensor, prompts: list[list[int]] | torch.Tensor) -> torch.Tensor:
    """The prompts' ids (lists of ids, or a tensor of ids of any shape) that the draft vocabulary ids [N] lacks:
    [E] sorted, distinct, possibly empty."""
    extra = with_prompt_tokens(ids[:0], prompts)  # [P] the prompts' ids, sorted, distinct
    if not extra.numel():
        return extra
    # A membership mask over the ids: a few microseconds, where sorting the 23k-id vocabulary again took ms.
    member = torch.zeros(max(int(ids.max()) if ids.numel() else 0, int(extra.max())) + 1, dtype=torch.bool,
                         device=ids.device)
    member[ids] = True
    return extra[~member[extra]]


def with_prompt_tokens(ids: torch.Tensor, prompts: list[list[int]] | torch.Tensor) -> torch.Tensor:
    """The union of the draft vocabulary ids [N] and every id of the prompts (lists of ids, or a tensor of ids
    of any shape): [N'] sorted, distinct."""
    if isinstance(prompts, torch.Tensor):
        extra = prompts.reshape(-1).to(ids.device)
    else:
        extra = torch.tensor([t for p in prompts for t in p], dtype=torch.long, device=ids.device)
    return torch.unique(torch.cat([ids, extra]))


def scatter_logits(sub_logits: torch.Tensor, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Logits over the draft vocabulary [..., N] -> full logits [..., V] with -inf outside it."""
    full = sub_logits.new_full((*sub_logits.shape[:-1], vocab_size), float("-inf"))
    return full.scatter_(-1, ids.expand(*sub_logits.shape[:-1], -1), sub_logits)
