"""`blockdraft inspect CHECKPOINT`: show the config and every check against the target; for a DFlash draft GGUF
(`export --to gguf`), the fields and tensors llama.cpp reads."""

from __future__ import annotations

import json
from pathlib import Path

from ..config import check_against_target
from ..io.vocab import VOCAB_FILE, read_vocab
from ..io.checkpoint import read_checkpoint
from ..io.drafts import DEFAULT_DRAFT
from ..io.gguf_draft import read_gguf_draft
from ..io.targets import load_target


def add_arguments(parser) -> None:
    parser.add_argument("checkpoint", type=Path, nargs="?", default=DEFAULT_DRAFT,
                        help="a draft checkpoint folder (default: the shipped draft), or a DFlash draft .gguf")
    parser.add_argument("--target", default=None, help="validate against this target (default: embedded)")
    parser.add_argument("--strict", action="store_true", help="refuse a provenance fingerprint mismatch")


def run(args) -> int:
    if args.checkpoint.suffix == ".gguf" and args.checkpoint.is_file():
        return _inspect_gguf(args.checkpoint)
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


def _inspect_gguf(path: Path) -> int:
    info = read_gguf_draft(path)
    print(json.dumps(info["fields"], indent=2, default=str))
    for name, (kind, shape) in info["tensors"].items():
        print(f"{name:32s} {kind:5s} {shape}")
    vocab = info["draft_vocab"]
    print(f"{len(info['tensors'])} tensors; tokenizer of {info['vocabulary_entries']} entries; "
          + ("the draft scores every id (the target's head)" if vocab is None
             else f"proposal vocabulary of {vocab} ids (d2t, own head rows)"))
    return 0
