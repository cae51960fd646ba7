"""What a decode request must be before any compute: its prompts, budgets, block size, stop ids and options,
each refused by name with the fix (a wrong type here would otherwise fail deep in the loop, or worse, be read
as something else: a tensor of stop ids that never matches, "off" taken as on)."""

from __future__ import annotations

from numbers import Integral

import torch

from ..errors import InputError
from ..model.target import Target


def _vocab_size(target) -> int:
    """The rows of the target's LM head: every id a request names must be one of them."""
    head = getattr(target, "lm_head", None)
    return head.weight.shape[0] if head is not None else target.config.vocab_size


def is_count(value) -> bool:
    """A positive whole number: a Python or NumPy integer, not a bool."""
    return isinstance(value, Integral) and not isinstance(value, bool) and value > 0


def check_request(target: Target, prompts, max_new_tokens, block_size: int, trained_block_size,
                  names: list[str] | None = None) -> None:
    """Refuse bad input before any compute, naming the parameter, the value and the fix.

    `max_new_tokens` is one budget for every prompt or a list with one per prompt; `names` name the prompts in
    messages (default: their index)."""
    if not prompts:
        raise InputError("no prompts given; pass at least one prompt")
    budgets = max_new_tokens if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens] * len(prompts)
    if len(budgets) != len(prompts) or not all(is_count(b) for b in budgets):
        raise InputError(f"`max_new_tokens` must be a positive integer (or a list of one per prompt), "
                         f"got {max_new_tokens!r}")
    vocab = _vocab_size(target)
    for index, (ids, budget) in enumerate(zip(prompts, budgets)):
        i = names[index] if names is not None else index
        if len(ids) == 0:
            raise InputError(f"prompt {i} is empty; give at least one token of prompt")
        bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, Integral) or not 0 <= t < vocab), None)
        if bad is not None:
            raise InputError(f"prompt {i} holds {bad!r}, not a token id of this target (integers in [0, {vocab})); "
                             "pass text, chat messages, or ids from this target's tokenizer")
        total = len(ids) + budget
        if total > target.max_positions:
            raise InputError(
                f"prompt {i} has {len(ids)} tokens and `max_new_tokens` is {budget}: {total} positions, "
                f"over the target's context of {target.max_positions}; shorten the prompt or lower max_new_tokens"
            )
    if trained_block_size is not None:
        trained = trained_block_size
        if not is_count(block_size) or not 2 <= block_size <= trained:
            raise InputError(
                f"`block_size` must be an integer in [2, {trained}] (the draft's trained block size), "
                f"got {block_size!r}; pass a block size of at most {trained}"
            )


def stop_ids(value, target: Target, default) -> set[int]:
    """The stop ids a request asks for: None is `default()` (the target's end-of-sequence ids); one id, a list,
    or a tensor of ids; each an integer id of the target."""
    if value is None:
        return set(default())
    if isinstance(value, torch.Tensor):
        value = value.flatten().tolist()
    elif isinstance(value, Integral) and not isinstance(value, bool):
        value = [value]
    vocab = _vocab_size(target)
    try:
        ids = list(value)
    except TypeError:
        ids = [value]
    bad = [v for v in ids if isinstance(v, bool) or not isinstance(v, Integral) or not 0 <= v < vocab]
    if bad or isinstance(value, (str, bytes)):
        raise InputError(f"`stop_token_ids` must be token ids of this target (integers in [0, {vocab})), got "
                         f"{value!r}; pass e.g. [tokenizer.eos_token_id], or [] to stop only at the budget")
    return {int(v) for v in ids}


def eos_ids(target: Target) -> set[int]:
    """The target's end-of-sequence ids: its generation config's, its config's and its tokenizer's."""
    ids = set()
    for source in (getattr(target.model, "generation_config", None), target.config, target.tokenizer):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, (list, tuple)):
            ids.update(int(e) for e in eos)
    return ids
