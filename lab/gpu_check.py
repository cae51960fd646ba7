"""What a GPU window checks before it trains (docs/training.md, "One GPU window").

1. The GGUF joined from its parts is byte for byte the embedded target's file (its sha256).
2. The target, loaded from it on the device in float32, decodes the greedy tokens computed on a CPU in float32
   and stored in lab/gpu_reference.json (`make_reference`). A token may differ only where the target's two
   best scores lie within float32 rounding of each other (decode/ties.py): summing in another order can pick
   either there. Any other difference means the device computes another model (a damaged file, another
   tokenizer or chat template, a converter that changed), and a draft trained on it would be fitted to that.
3. The draft's geometry is valid for the target, and its folder fits what a call returns (`draft_files`).

Each failed check raises `Refused` saying what differs; the driver writes the reason under its output folder.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from time import monotonic

REFERENCE_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "What is the capital of France? Answer in one sentence.",
    "List three colors of the rainbow.",
    "Explain in two sentences why the sky is blue.",
)
REFERENCE_TOKENS = 48


RETURN_LIMIT = 8  # files a device call brings back from $OUT


class Refused(Exception):
    """A check failed: training now would fit a draft to something other than the target."""


def join_parts(parts: list[Path], out: Path) -> Path:
    """Concatenate the parts, in name order, into `out`."""
    if not parts:
        raise Refused("no part_* files to join; run the `part I` calls first (they copy the GGUF's parts)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as joined:
        for part in sorted(parts, key=lambda p: p.name):
            with open(part, "rb") as handle:
                shutil.copyfileobj(handle, joined, 1 << 22)
    return out


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def check_sha256(path: Path, expected_file: Path) -> str:
    """The file's sha256, after checking it against the one `expected_file` holds (a missing part, a part
    copied twice or cut short in transfer all change it)."""
    expected = expected_file.read_text().split()[0].strip().lower() if expected_file.is_file() else None
    if not expected:
        raise Refused(f"no expected sha256 in {expected_file}; pass --sha256-file (`gpu_train.sh split` writes it into the "
                      "last .gpu_N folder)")
    found = sha256_of(path)
    if found != expected:
        raise Refused(f"{path} has sha256 {found}, but {expected_file} expects {expected}: a part is missing, "
                      "doubled or damaged; run every `part I` call again, back to back, then `run`")
    return found


def install_wheels(wheel_dir: Path, site: Path) -> list[str]:
    """Install the carried wheels (no index, no dependencies) into `site` and put it first on sys.path."""
    wheels = sorted(str(w) for w in wheel_dir.glob("*.whl"))
    if not wheels:
        raise Refused(f"no wheels in {wheel_dir}; carry the folder `gpu_train.sh split` fills (.whl, with the gguf wheel)")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--upgrade", "--target", str(site), *wheels], check=True)
    sys.path.insert(0, str(site))
    return [Path(w).name for w in wheels]


def make_reference(target, gguf_sha256: str, prompts=REFERENCE_PROMPTS,
                   max_new_tokens: int = REFERENCE_TOKENS) -> dict:
    """Greedy tokens of the target alone for each prompt, decoded one prompt at a time (a float32 CPU target
    loaded from the GGUF of `gguf_sha256`)."""
    import torch
    import transformers

    from blockdraft.api import encode, generate

    rows = []
    for text in prompts:
        ids = encode(target, text)
        rows.append({"text": text, "prompt_ids": ids,
                     "tokens": generate(target, None, ids, max_new_tokens=max_new_tokens).tokens})
    return {"format": 1, "target": target.name, "gguf_sha256": gguf_sha256,
            "dtype": str(target.dtype).removeprefix("torch."), "device": str(target.device),
            "max_new_tokens": max_new_tokens, "decoding": "greedy, target alone, one prompt at a time",
            "made_with": {"python": platform.python_version(), "torch": torch.__version__,
                          "transformers": transformers.__version__, "machine": platform.machine()},
            "command": "lab/gpu_train.sh reference", "prompts": rows}


def check_greedy(target, reference: dict) -> list[str]:
    """Refuse unless the target decodes the reference's tokens; returns notes on near-ties it met."""
    import torch

    from blockdraft.api import encode, generate
    from blockdraft.decode.ties import first_split, is_rounding

    # In bf16 (or with TF32 matmuls) near-ties are far more common; the reference is float32 and so is this check.
    if target.dtype != torch.float32:
        raise Refused(f"the greedy check needs the target in float32, got {target.dtype}")
    notes = []
    for number, row in enumerate(reference["prompts"], 1):
        ids = encode(target, row["text"])
        if ids != row["prompt_ids"]:
            at = next((i for i, (a, b) in enumerate(zip(ids, row["prompt_ids"])) if a != b),
                      min(len(ids), len(row["prompt_ids"])))
            raise Refused(f"prompt {number} ({row['text'][:40]!r}) tokenizes differently from the reference from "
                          f"position {at} ({len(ids)} ids against {len(row['prompt_ids'])}): another tokenizer or "
                          "chat template")
        tokens = generate(target, None, ids, max_new_tokens=reference["max_new_tokens"]).tokens
        split = first_split(target, [ids], [row["tokens"]], [tokens])
        if split is None:
            continue
        where = (f"prompt {number} ({row['text'][:40]!r}), new token {split.index}: reference "
                 f"{split.base_token} {_text(target, split.base_token)}, here {split.other_token} "
                 f"{_text(target, split.other_token)}, the target's margin {abs(split.margin):.3g} at score scale "
                 f"{split.scale:.3g}")
        if not is_rounding(split, torch.float32):
            raise Refused(f"greedy tokens differ from the CPU float32 reference at {where}, beyond float32 rounding: "
                          "the device runs another model; check the GGUF and the transformers version")
        notes.append(f"near-tie at {where}: float32 rounding, accepted; the rest of that prompt is not compared")
    return notes


def draft_files(target, layers: int, block_size: int, layer_ids, folder: Path) -> list[str]:
    """The files of a draft folder of this geometry, from a draft of zeros written to `folder` (deleted after):
    the draft's own checks run before any data is generated, and the count is the trainer's writer's own."""
    import torch

    from blockdraft.config import DraftConfig, choose_mask_token_id
    from blockdraft.io.vocab import VOCAB_FILE
    from blockdraft.io.checkpoint import expected_tensor_shapes, write_checkpoint

    mask = choose_mask_token_id(target.tokenizer, target.config, None)
    cfg = DraftConfig.for_target(target.config, layers, block_size, mask_token_id=mask, target_layer_ids=layer_ids)
    zeros = {name: torch.zeros(shape, dtype=torch.bfloat16) for name, shape in expected_tensor_shapes(cfg).items()}
    shutil.rmtree(folder, ignore_errors=True)
    try:
        write_checkpoint(folder, cfg, zeros, dtype=torch.bfloat16)
        return sorted([p.name for p in folder.iterdir()] + [VOCAB_FILE])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _text(target, token: int) -> str:
    return repr(target.tokenizer.decode([token])) if target.tokenizer is not None else ""


def check(args, log, sha256: str) -> dict:
    import torch

    from blockdraft.io.targets import load_target

    from gpu_geometry import geometries
    from gpu_stages import free_gpu_memory

    started = monotonic()
    reference = json.loads(args.reference.read_text())
    if reference["gguf_sha256"] != sha256:
        raise Refused(f"{args.reference} was computed from a GGUF with sha256 {reference['gguf_sha256']}, not this "
                      "one; run `lab/gpu_train.sh reference` where that file is installed")
    torch.set_float32_matmul_precision("highest")  # no TF32: the reference is float32 all through
    target = load_target(dtype="float32", device=args.device)
    notes = check_greedy(target, reference)
    log.line(f"check: greedy tokens of {len(reference['prompts'])} prompts agree with the CPU float32 reference"
             + "".join(f"; {note}" for note in notes))
    counts = {}
    for geometry in filter(None, geometries(args)):
        files = draft_files(target, geometry.layers, geometry.block_size, geometry.layer_ids, args.work / "probe")
        if len(files) + 2 > RETURN_LIMIT:
            raise Refused(f"a draft of {geometry.layers} layers is {len(files)} files ({', '.join(files)}); with "
                          f"run.log and summary.json that is over the {RETURN_LIMIT} files a call returns; use fewer "
                          "layers")
        counts[geometry.name()] = files
    device = torch.cuda.get_device_name() if target.device.type == "cuda" else "cpu"
    del target
    free_gpu_memory()
    # data.tar is the file left over, if one is
    args.data_returned = max(len(files) for files in counts.values()) + 3 <= RETURN_LIMIT
    return {"greedy": "agrees", "near_ties": notes, "draft_files": counts, "device": device,
            "data_returned": args.data_returned, "seconds": round(monotonic() - started, 1)}
