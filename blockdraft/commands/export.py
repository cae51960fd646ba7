"""`blockdraft export DRAFT OUT --to transformers|gguf`: write a draft in a form another runtime loads as it is."""

from __future__ import annotations

from pathlib import Path

from ..checks import raise_collected
from ..io.vocab import read_vocab
from ..errors import InputError
from ..io.checkpoint import read_checkpoint, write_transformers_checkpoint
from ..io.drafts import DEFAULT_DRAFT
from ..io.gguf_draft import GGUF_DTYPES, gguf_problems, write_gguf_draft
from ..io.targets import EMBEDDED_HUB_ID, embedded_gguf_path

FORMATS = ("transformers", "gguf")


def add_arguments(parser) -> None:
    parser.add_argument("draft", type=Path, nargs="?", default=DEFAULT_DRAFT,
                        help="draft folder to export (default: the shipped SmolLM2-135M-Instruct draft)")
    parser.add_argument("out", type=Path, help="transformers: a new or empty folder; gguf: a new .gguf file")
    parser.add_argument("--to", choices=FORMATS, default="transformers",
                        help="transformers: `generate(..., assistant_model=draft, speculation_type='dflash')`; "
                             "gguf: llama.cpp's `--spec-type draft-dflash -md OUT`")
    parser.add_argument("--gguf-dtype", choices=sorted(GGUF_DTYPES), default="f16",
                        help="gguf: type of the draft's matrices (norms stay float32, as llama.cpp's converter "
                             "writes them)")
    parser.add_argument("--target-gguf", type=Path, default=None,
                        help="gguf: the target's own GGUF, for its tokenizer and head rows (default: the embedded "
                             "target's file, for drafts of the embedded target)")
    parser.add_argument("--full-vocab", action="store_true",
                        help="gguf: leave out the proposal vocabulary (d2t and reduced head): the draft scores "
                             "every id, as llama.cpp's own converter writes it")


def run(args) -> int:
    cfg, tensors = read_checkpoint(args.draft)
    if args.to == "gguf":
        return _to_gguf(args, cfg, tensors)
    out = args.out
    # Never mix an export into other files: stale weights beside a new config.json would load silently.
    if out.exists() and not out.is_dir():
        raise InputError(f"OUT {out} is a file; pass a new or empty folder")
    if out.is_dir() and any(out.iterdir()):
        raise InputError(f"OUT {out} exists and is not empty; pass a new or empty folder, or delete its contents")
    write_transformers_checkpoint(out, cfg, tensors)
    print(f"wrote {out}: {len(tensors)} tensors for transformers' DFlash path; load it with "
          f"MuseGlimmerAssistantModel.from_pretrained({str(out)!r}) and pass it to "
          "generate(..., assistant_model=draft, speculation_type='dflash')")
    return 0


def _to_gguf(args, cfg, tensors) -> int:
    out = args.out
    if out.exists():
        raise InputError(f"OUT {out} exists; pass a new .gguf path, or delete it")
    if out.suffix != ".gguf":
        raise InputError(f"OUT {out} does not end in .gguf; llama.cpp's tools expect a .gguf file name")
    raise_collected(gguf_problems(cfg))
    target_gguf = args.target_gguf or _default_target_gguf(cfg)
    vocab = None if args.full_vocab else read_vocab(args.draft, cfg.vocab_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    write_gguf_draft(tmp, cfg, tensors, target_gguf, args.gguf_dtype, vocab)
    tmp.replace(out)  # a killed export leaves only the .partial file, never a truncated OUT
    head = "the target's full head" if vocab is None else f"a head over its {vocab.numel()} proposal ids (d2t)"
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB): {len(tensors)} tensors in {args.gguf_dtype}, "
          f"{head}, target_layers {[i + 1 for i in cfg.target_layer_ids]}, block size {cfg.block_size}; run it with "
          f"llama.cpp: llama-server -m {target_gguf} --spec-type draft-dflash -md {out}")
    return 0


def _default_target_gguf(cfg) -> Path:
    target = (cfg.provenance or {}).get("target")
    if target != EMBEDDED_HUB_ID:
        raise InputError(f"the draft was trained for {target or 'an unrecorded target'}, whose GGUF blockdraft "
                         "does not ship; pass --target-gguf PATH, the target's own GGUF as llama.cpp runs it")
    return embedded_gguf_path()
