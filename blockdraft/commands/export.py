"""`blockdraft export DRAFT OUT --to transformers`: write a draft in a form another runtime loads as it is."""

from __future__ import annotations

from pathlib import Path

from ..io.drafts import DEFAULT_DRAFT
from ..errors import InputError
from ..io.checkpoint import read_checkpoint, write_transformers_checkpoint

FORMATS = ("transformers",)


def add_arguments(parser) -> None:
    parser.add_argument("draft", type=Path, nargs="?", default=DEFAULT_DRAFT,
                        help="draft folder to export (default: the shipped SmolLM2-135M-Instruct draft)")
    parser.add_argument("out", type=Path, help="new or empty folder to write the export into")
    parser.add_argument("--to", choices=FORMATS, default="transformers",
                        help="transformers: `generate(..., assistant_model=draft, speculation_type='dflash')`")


def run(args) -> int:
    out = args.out
    # Never mix an export into other files: stale weights beside a new config.json would load silently.
    if out.exists() and not out.is_dir():
        raise InputError(f"OUT {out} is a file; pass a new or empty folder")
    if out.is_dir() and any(out.iterdir()):
        raise InputError(f"OUT {out} exists and is not empty; pass a new or empty folder, or delete its contents")
    cfg, tensors = read_checkpoint(args.draft)
    write_transformers_checkpoint(out, cfg, tensors)
    print(f"wrote {out}: {len(tensors)} tensors for transformers' DFlash path; load it with "
          f"MuseGlimmerAssistantModel.from_pretrained({str(out)!r}) and pass it to "
          "generate(..., assistant_model=draft, speculation_type='dflash')")
    return 0
