"""`blockdraft inspect CHECKPOINT`: show the config and every check against the target."""

from __future__ import annotations

import json
from pathlib import Path

from ..config import check_against_target
from ..decode.vocab import VOCAB_FILE, read_vocab
from ..io.checkpoint import read_checkpoint
from ..io.drafts import DEFAULT_DRAFT
from ..io.targets import load_target


def add_arguments(parser) -> None:
    parser.add_argument("checkpoint", type=Path, nargs="?", default=DEFAULT_DRAFT,
                        help="a draft checkpoint folder (default: the shipped draft)")
    parser.add_argument("--target", default=None, help="validate against this target (default: embedded)")
    parser.add_argument("--strict", action="store_true", help="refuse a provenance fingerprint mismatch")


def run(args) -> int:
    cfg, tensors = read_checkpoint(args.checkpoint)
    print(json.dumps(cfg.to_dict(), indent=2))
    params = sum(t.numel() for t in tensors.values())
    print(f"{len(tensors)} tensors, {params:,} parameters")
    target = load_target(args.target, dtype="float32")
    warnings = check_against_target(cfg, target.config, target.tokenizer, strict=args.strict)
    for message in warnings:
        print(f"warning: {message}")
    vocab = read_vocab(args.checkpoint, target.lm_head.weight.shape[0])
    print(f"proposal vocabulary ({VOCAB_FILE}): " + ("none, the draft proposes any id" if vocab is None else
                                                     f"{vocab.numel()} of {target.lm_head.weight.shape[0]} ids"))
    print(f"ok: the checkpoint matches target {target.name}")
    return 0
