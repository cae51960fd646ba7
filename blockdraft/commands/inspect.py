"""`blockdraft inspect CHECKPOINT`: show the config and every check against the target."""

from __future__ import annotations

import json

from ..config import check_against_target
from ..io.checkpoint import read_checkpoint
from ..io.targets import load_target


def run_inspect(args) -> int:
    cfg, tensors = read_checkpoint(args.checkpoint)
    print(json.dumps(cfg.to_dict(), indent=2))
    params = sum(t.numel() for t in tensors.values())
    print(f"{len(tensors)} tensors, {params:,} parameters")
    target = load_target(args.target, dtype="float32")
    warnings = check_against_target(cfg, target.config, target.tokenizer, strict=args.strict)
    for message in warnings:
        print(f"warning: {message}")
    print(f"ok: the checkpoint matches target {target.name}")
    return 0
