"""Tapped target features on disk beside a data folder's shards: training reads them and runs only the draft.

Training spends most of its time re-running the frozen target over each sequence, the same features every epoch and
every run. The store holds them once:

    DATA/features/<key>/data-NNNNN.safetensors     one file per token shard, written whole by `blockdraft features`

<key> names what the features depend on: the target, its dtype and the tapped layer ids (`store_key`). In a file,
each example's features [S, L*D] (its whole sequence, in the target's dtype) are stored under the digest of its
token ids, so a run finds them by its examples' tokens alone, whatever folders, order or deduplication it uses.
The target runs only up to the deepest tapped layer, never its head. The store is a cache, not data: it is not
committed, and a fresh machine rebuilds it from the committed token shards (a shard whose file exists is skipped,
so a stopped build resumes).

Memory and disk: L·D values a token (SmolLM2, two taps, bf16: 2.3 KB a token, 4.5 GB for 2M tokens).

Shapes: B sequences, S tokens, L tapped layers, D hidden.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save as save_tensors

from ..model.target import Target
from .data import read_examples, shard_files, write_atomically
from .forward import target_features

FOLDER = "features"


def store_key(target: Target, tap_layer_ids) -> str:
    """What a store's features depend on, as a folder name: e.g. `smollm2-135m-instruct-bfloat16-taps-1-27`."""
    name = re.sub(r"[^a-z0-9.]+", "-", target.name.split("/")[-1].lower()).strip("-") or "target"
    dtype = str(target.dtype).removeprefix("torch.")
    return f"{name}-{dtype}-taps-{'-'.join(str(i) for i in tap_layer_ids)}"


def store_dir(data_dir: str | Path, target: Target, tap_layer_ids) -> Path:
    return Path(data_dir) / FOLDER / store_key(target, tap_layer_ids)


def token_digest(ids) -> str:
    """The key of a sequence's features: a digest of its token ids."""
    return hashlib.blake2b(np.asarray(ids, dtype=np.int64).tobytes(), digest_size=16).hexdigest()


@torch.no_grad()
def build_store(target: Target, data_dir: str | Path, tap_layer_ids, *, batch_tokens: int = 4096,
                on_shard: Callable[[int], None] | None = None) -> dict:
    """Write the features of every shard of `data_dir` that has none yet; returns counts of what was done.

    Examples run in batches of similar length (up to `batch_tokens` padded tokens), right-padded: padding follows
    every real token of a row, so a causal forward gives the real tokens the features they have alone."""
    data_dir = Path(data_dir)
    folder = store_dir(data_dir, target, tap_layer_ids)
    folder.mkdir(parents=True, exist_ok=True)
    done = {"shards_written": 0, "shards_kept": 0, "sequences": 0, "tokens": 0}
    for shard in shard_files(data_dir):
        out = folder / f"{shard.stem}.safetensors"
        if out.is_file():
            done["shards_kept"] += 1
        else:
            tensors = _shard_features(target, read_examples(shard, target.tokenizer), tap_layer_ids, batch_tokens)
            write_store_file(folder, shard, tensors, target, tap_layer_ids)
            done["shards_written"] += 1
            done["sequences"] += len(tensors)
            done["tokens"] += sum(t.shape[0] for t in tensors.values())
        if on_shard is not None:
            on_shard(1)
    return done


def write_store_file(folder: Path, shard: Path, tensors: dict[str, torch.Tensor], target: Target,
                     tap_layer_ids) -> None:
    """Write the store's file for token shard `shard`: digest -> features [S, L*D], whole or not at all."""
    metadata = {"target": target.name, "dtype": str(target.dtype), "taps": ",".join(map(str, tap_layer_ids)),
                "shard": shard.name}
    write_atomically(folder / f"{shard.stem}.safetensors", save_tensors(tensors, metadata=metadata))


def _shard_features(target: Target, examples: list, tap_layer_ids, batch_tokens: int) -> dict[str, torch.Tensor]:
    """digest -> features [S, L*D] of each example (one entry per distinct token sequence)."""
    unique = {token_digest(e.input_ids): list(e.input_ids) for e in examples}
    order = sorted(unique, key=lambda d: len(unique[d]))
    out: dict[str, torch.Tensor] = {}
    while order:
        batch = [order.pop()]  # the longest left first: its width bounds the batch
        width = len(unique[batch[0]])
        while order and (len(batch) + 1) * width <= batch_tokens:
            batch.append(order.pop())
        tokens = torch.zeros(len(batch), width, dtype=torch.long)  # [B, S] right-padded with id 0
        for row, digest in enumerate(batch):
            tokens[row, : len(unique[digest])] = torch.tensor(unique[digest])
        features = target_features(target, tokens.to(target.device), tap_layer_ids, stop_after_taps=True)
        for row, digest in enumerate(batch):
            out[digest] = features[row, : len(unique[digest])].to("cpu").contiguous()  # [S, L*D]
    return out


class FeatureStore:
    """Read side of the stores of several data folders: digest -> features [S, L*D], read lazily from the files."""

    def __init__(self, folders: list[Path]) -> None:
        self.where: dict[str, Path] = {}
        for folder in folders:
            for path in sorted(Path(folder).glob("*.safetensors")) if Path(folder).is_dir() else []:
                with safe_open(str(path), framework="pt") as handle:
                    for digest in handle.keys():
                        self.where.setdefault(digest, path)
        self._open: dict[Path, object] = {}

    def __len__(self) -> int:
        return len(self.where)

    def __contains__(self, digest: str) -> bool:
        return digest in self.where

    def get(self, digest: str) -> torch.Tensor:
        path = self.where[digest]
        if path not in self._open:
            self._open[path] = safe_open(str(path), framework="pt")
        return self._open[path].get_tensor(digest)
