"""The draft's proposal vocabulary on disk: `blockdraft_vocab.json` beside its weights (decode/vocab.py says what
the ids do at run time).

The file holds the sorted distinct ids the draft scores, the size of the target vocabulary they index, and where
they came from; a file of another target, or damaged, is refused with the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import torch

from ..errors import CheckpointError

VOCAB_FILE = "blockdraft_vocab.json"
VOCAB_FORMAT = "blockdraft-draft-vocab-v1"


def write_vocab(folder: str | Path, ids: Iterable[int], vocab_size: int, source: str) -> Path:
    """Write the sidecar: sorted distinct ids, the target vocabulary size they index, and where they came from."""
    ids = sorted(set(int(i) for i in ids))
    path = Path(folder) / VOCAB_FILE
    record = {"format": VOCAB_FORMAT, "vocab_size": vocab_size, "source": source, "token_ids": ids}
    path.write_text(json.dumps(record, separators=(",", ":")) + "\n", encoding="utf-8")
    return path


def read_vocab(folder: str | Path, vocab_size: int) -> torch.Tensor | None:
    """The sidecar's ids [N] int64 (sorted, distinct, < vocab_size), or None when the folder has none."""
    path = Path(folder) / VOCAB_FILE
    if not path.is_file():
        return None
    fix = f"delete {path} to draft over the full vocabulary, or rewrite it with blockdraft.decode.vocab.write_vocab"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path} is not valid JSON ({error}); {fix}") from error
    if not isinstance(record, dict) or record.get("format") != VOCAB_FORMAT:
        raise CheckpointError(f"{path} is not a {VOCAB_FORMAT} file; {fix}")
    if record.get("vocab_size") != vocab_size:
        raise CheckpointError(f"{path} indexes a vocabulary of {record.get('vocab_size')} ids but the target has "
                              f"{vocab_size}: it belongs to another target; {fix}")
    ids = record.get("token_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise CheckpointError(f"{path}: `token_ids` must be a non-empty list of integers; {fix}")
    if ids != sorted(set(ids)) or ids[0] < 0 or ids[-1] >= vocab_size:
        raise CheckpointError(f"{path}: `token_ids` must be sorted, distinct and in [0, {vocab_size}); {fix}")
    return torch.tensor(ids, dtype=torch.long)
