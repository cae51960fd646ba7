"""The embedded target's tied embedding at the GGUF file's own precision: Q8_0 rows, read from the file as needed.

SmolLM2's GGUF stores the tied embedding (which is also the LM head) as Q8_0: each row of 576 values in blocks of
32, a block being float16 d and 32 int8 codes q, meaning w = d * q. transformers turns the file into float32
weights w = float32(d) * float32(q), and a bf16 target rounds those to bf16. `Q8Rows` computes the same bits for
the rows asked (tests/test_q8.py compares every row), reading them from the file: an embedding lookup reads a
few rows of 612 bytes, and the 54 MiB of a bf16 embedding are never held. The head
keeps its packed bf16 copy (packed.py; built once from `all()`), so the int4 target (`--weights q4`) holds its
int4 layers and one head: 117 MiB in all, where the bf16 embedding beside the packed head made it 171.

Shapes: V rows (the vocabulary), D width, G = D / 32 blocks a row, N ids asked.
"""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import CheckpointError, ConfigError
from .packed import PACK_ROWS, PackedConcat, packing_supported

BLOCK = 32  # values per Q8_0 block
BLOCK_BYTES = 2 + BLOCK  # float16 d, then 32 int8 codes
CHUNK_ROWS = 1024  # rows read and dequantized at a time (their float32 temporaries stay a few MB)
KEPT_ROWS = 2048  # single rows kept by Q8Rows (`_one`), 1,152 bytes each for SmolLM2


class Q8Rows:
    """A weight [V, D] stored as Q8_0 blocks in a file, from byte `offset` on, row after row. Rows are read from
    the file when asked (`os.pread`): nothing of the weight is held or mapped, and the file's pages stay the
    kernel's cache, outside the process's memory."""

    def __init__(self, path: Path, offset: int, rows: int, width: int) -> None:
        self.path, self.offset, self.shape = Path(path), offset, (rows, width)  # shape (V, D)
        self.row_bytes = width // BLOCK * BLOCK_BYTES
        self._fd = os.open(self.path, os.O_RDONLY)
        # The last rows asked one at a time (a decode step's tokens), by id: an answer's tokens repeat, and a kept
        # row costs 3 us to hand out against about 30 to read and dequantize. At most KEPT_ROWS (2.3 MB).
        self._kept: OrderedDict[int, torch.Tensor] = OrderedDict()

    def __del__(self) -> None:
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)
            self._fd = None

    def _raw(self, data: bytes, count: int) -> torch.Tensor:
        if len(data) != count * self.row_bytes:  # the file shrank or changed since it was opened
            raise CheckpointError(f"{self.path} ends inside its embedding; reinstall the package that ships it")
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(count, -1, BLOCK_BYTES)  # [N, G, 34]

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [...] -> bf16 [..., D]: the rows a bf16 copy of the file's float32 weights holds, bit for bit."""
        flat = ids.reshape(-1).tolist()
        if flat and not 0 <= min(flat) <= max(flat) < self.shape[0]:
            raise IndexError(f"ids {min(flat)}..{max(flat)} outside the embedding's {self.shape[0]} rows")
        if len(flat) == 1:
            return self._one(flat[0]).clone().view(*ids.shape, self.shape[1]).to(ids.device)  # a copy: the caller's
        out = torch.empty(len(flat), self.shape[1], dtype=torch.bfloat16)  # [N, D]
        for start in range(0, len(flat), CHUNK_ROWS):
            chunk = flat[start: start + CHUNK_ROWS]
            data = b"".join(os.pread(self._fd, self.row_bytes, self.offset + i * self.row_bytes) for i in chunk)
            out[start: start + len(chunk)] = dequantize(self._raw(data, len(chunk)))
        return out.reshape(*ids.shape, self.shape[1]).to(ids.device)

    def _one(self, index: int) -> torch.Tensor:
        """Row `index` bf16 [D], read once and kept among the last KEPT_ROWS asked (hand out copies: a forward adds
        into its embedded rows in place)."""
        row = self._kept.get(index)
        if row is None:
            data = os.pread(self._fd, self.row_bytes, self.offset + index * self.row_bytes)
            row = self._kept[index] = dequantize(self._raw(data, 1))[0]
            if len(self._kept) > KEPT_ROWS:
                self._kept.popitem(last=False)
        else:
            self._kept.move_to_end(index)
        return row

    def all(self) -> torch.Tensor:
        """The whole weight bf16 [V, D], read and dequantized CHUNK_ROWS rows at a time."""
        out = torch.empty(self.shape, dtype=torch.bfloat16)
        for start in range(0, self.shape[0], CHUNK_ROWS):
            count = min(CHUNK_ROWS, self.shape[0] - start)
            data = os.pread(self._fd, count * self.row_bytes, self.offset + start * self.row_bytes)
            out[start: start + count] = dequantize(self._raw(data, count))
        return out


def dequantize(raw: torch.Tensor) -> torch.Tensor:
    """Q8_0 blocks raw [N, G, 34] uint8 -> bf16 [N, G * 32]: bf16(float32(d) * float32(q)), as transformers'
    float32 weights rounded to bf16."""
    d = raw[..., :2].contiguous().view(torch.float16).float()  # [N, G, 1]
    q = raw[..., 2:].contiguous().view(torch.int8).float()  # [N, G, 32]
    return (q * d).to(torch.bfloat16).reshape(raw.shape[0], -1)


def rows_can_serve() -> bool:
    """Whether Q8Rows can stand in for a bf16 embedding and head here: the head's packed copy needs oneDNN's
    packed bf16 linear (packed.py)."""
    return packing_supported(torch.empty(0, 1, dtype=torch.bfloat16))


class Q8Embedding(nn.Module):
    """`nn.Embedding` over Q8Rows: ids [...] -> bf16 [..., D]. `weight` is a meta tensor of the weight's shape
    and dtype (what callers ask of an embedding's weight), holding nothing."""

    def __init__(self, rows: Q8Rows) -> None:
        super().__init__()
        self.source = rows
        self.weight = torch.empty(rows.shape, dtype=torch.bfloat16, device="meta")

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.source.rows(ids)


class Q8Head(nn.Module):
    """The LM head over the same rows, as the HF model's `lm_head`: x [..., D] -> [..., V] through `product`
    (the target's packed head). `weight` is a meta tensor like Q8Embedding's."""

    def __init__(self, rows: Q8Rows, product) -> None:
        super().__init__()
        self.product = product
        self.in_features, self.out_features = rows.shape[1], rows.shape[0]
        self.weight = torch.empty(rows.shape, dtype=torch.bfloat16, device="meta")
        self.bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.product(x)


class PackedQ8(PackedConcat):
    """The head over Q8Rows as one packed bf16 copy, made once; no plain copy is kept. bf16 CPU rows
    that need no gradient take the packed product (the one a plain bf16 head's PackedLinear runs, so the same
    bits); any other input takes `F.linear` over the rows dequantized again, as a plain head's fallback would."""

    def __init__(self, rows: Q8Rows, weight: torch.Tensor | None = None) -> None:
        """`weight`: the rows already dequantized (bf16 [V, D], equal to `rows.all()`) to pack, or None: read them."""
        self.rows, self.weights, self.biases, self.bias = rows, [], None, None
        self.packed = torch.ops.mkldnn._reorder_linear_weight(rows.all() if weight is None else weight, PACK_ROWS)

    def ready(self) -> bool:
        return True  # the file's rows never change

    def _reference(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.rows.all().to(x.dtype).to(x.device))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad or x.dtype != torch.bfloat16 or x.device.type != "cpu":
            return self._reference(x)
        return self.product(x)


def serve_from_rows(model, weight: torch.Tensor, rows: Q8Rows) -> tuple[PackedQ8, Q8Embedding, Q8Head] | None:
    """The HF `model`'s tied embedding and head (its weight [V, D], on the meta device when it was never read) from
    the file's Q8_0 rows: lookups read the rows they need, the head keeps its packed copy alone, and the bf16
    weight, a third of an int4 target's memory, is dropped. Sets the model's input and output embeddings and
    returns (the packed head, the embedding, the model's head module); None where a loaded weight is not the
    rows' bits (checked on 64 rows across it): the weight then stays, with a warning."""
    if rows.shape != tuple(weight.shape):
        raise ConfigError(f"the file's embedding is {list(rows.shape)}, the target's {list(weight.shape)}; "
                          "pass the GGUF of this target")
    weight = weight.detach()
    if not weight.is_meta:
        probe = torch.linspace(0, weight.shape[0] - 1, 64).long()
        if weight.dtype != torch.bfloat16 or not torch.equal(rows.rows(probe), weight[probe]):
            warnings.warn(f"{rows.path.name}: its embedding is not the loaded weight's bits; keeping the loaded "
                          "weight (clear the converted copy in the cache if the file changed)", stacklevel=4)
            return None
    head, embedding = PackedQ8(rows, None if weight.is_meta else weight), Q8Embedding(rows)
    model.set_input_embeddings(embedding)
    model.set_output_embeddings(Q8Head(rows, head))  # the HF model's own forward (hf-generate) runs it too
    return head, embedding, model.get_output_embeddings()
