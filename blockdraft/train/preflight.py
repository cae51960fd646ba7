"""Refusals before the first step: a starting draft that disagrees with the training config, and data that
would silently collapse acceptance (the mask id occurring in it) or index outside the target's embedding."""

from __future__ import annotations

from ..config import DraftConfig
from ..errors import ConfigError, InputError
from .data import Example
from .settings import TrainConfig


def check_init(cfg: TrainConfig, draft_cfg: DraftConfig) -> None:
    # The loaded draft defines the shape and interface; a TrainConfig that says otherwise is a mistake.
    wanted = {"num_hidden_layers": cfg.num_draft_layers, "block_size": cfg.block_size,
              "mask_token_id": cfg.mask_token_id, "target_layer_ids": cfg.target_layer_ids}
    wrong = [f"{k} {v!r} vs the draft's {getattr(draft_cfg, k)!r}" for k, v in wanted.items()
             if v is not None and v != getattr(draft_cfg, k)]
    if draft_cfg.final_logit_softcapping is not None:
        wrong.append("the draft uses final_logit_softcapping, which training does not apply")
    if wrong:
        raise ConfigError(f"`init_from` {cfg.init_from} does not match the training config: {'; '.join(wrong)}; "
                          "set the training options to the draft's values")


def check_data(examples: list[Example], draft_cfg: DraftConfig, where: str,
               max_seq_len: int | None = None) -> str:
    """Refuse a mask id that occurs in the data (TRAINING.md §5.6), ids outside the embedding and, given the run's
    `max_seq_len`, data of which no example keeps an anchor (two supervised tokens in a row) once truncated: such a
    run would step through all-zero losses and export an untrained draft. Returns a note on the examples that
    truncation cuts or leaves without an anchor ("" when none)."""
    truncated = anchorless = 0
    for example in examples:
        mask = example.loss_mask if max_seq_len is None else example.loss_mask[:max_seq_len]
        truncated += len(mask) < len(example.loss_mask)
        anchorless += not any(a and b for a, b in zip(mask, mask[1:]))
        ids = set(example.input_ids)
        if draft_cfg.mask_token_id in ids:
            raise ConfigError(f"the mask token id {draft_cfg.mask_token_id} occurs in example {example.id!r} of "
                              f"{where}; the mask must be a token the data never contains; pass another "
                              "mask_token_id (an unused special token)")
        if max(ids) >= draft_cfg.vocab_size:
            raise InputError(f"example {example.id!r} of {where} has token id {max(ids)}, outside the target's "
                             f"{draft_cfg.vocab_size}-row embedding; the data was built with another tokenizer; "
                             "rebuild it with this target")
    limit = "" if max_seq_len is None else f" within max_seq_len {max_seq_len}"
    if examples and anchorless == len(examples):
        raise InputError(f"none of the {len(examples)} examples of {where} has two supervised tokens in a row{limit} "
                         f"({truncated} truncated), so no block could be trained; raise --max-seq-len, or rebuild "
                         "the data with responses (loss_mask 1)")
    if not truncated and not anchorless:
        return ""
    return (f"{truncated} of {len(examples)} examples are cut at max_seq_len {max_seq_len}; {anchorless} keep no "
            "anchor and train nothing")
