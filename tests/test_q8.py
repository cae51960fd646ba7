"""The tied embedding and head from a GGUF's Q8_0 rows (model/q8.py): the converter's bits, row by row; a packed head
that keeps no plain copy; and an int4 target that holds no bf16 embedding yet computes what it computed with one."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from blockdraft.errors import CheckpointError
from blockdraft.io import gguf as gguf_io
from blockdraft.model import q8
from blockdraft.model.packed import PackedLinear

from tiny_models import needs_packing, needs_smollm2

Q8_0 = gguf.GGMLQuantizationType.Q8_0


def write_gguf(path: Path, qtype=Q8_0, rows: int = 96, width: int = 64) -> tuple[Path, np.ndarray]:
    """A GGUF holding one token_embd.weight [rows, width] of `qtype`; and the float32 weights the file means."""
    weight = np.random.default_rng(0).standard_normal((rows, width)).astype(np.float32)
    data = gguf.quants.quantize(weight, qtype)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor("token_embd.weight", data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, gguf.quants.dequantize(data, qtype)  # what transformers converts the file to


def test_rows_are_the_converted_float32_weights_rounded_to_bf16(tmp_path):
    path, converted = write_gguf(tmp_path / "m.gguf")
    rows = gguf_io.read_q8_rows(path)
    expected = torch.from_numpy(converted).to(torch.bfloat16)  # [96, 64]
    assert rows.shape == (96, 64) and torch.equal(rows.all(), expected)
    ids = torch.tensor([[3, 95, 0], [7, 7, 50]])
    assert torch.equal(rows.rows(ids), expected[ids]), "any rows, any id shape, bit for bit"


def test_all_is_assembled_in_chunks_without_a_seam(tmp_path, monkeypatch):
    path, converted = write_gguf(tmp_path / "m.gguf")
    monkeypatch.setattr(q8, "CHUNK_ROWS", 40)  # 96 rows: chunks of 40, 40 and 16
    rows, expected = gguf_io.read_q8_rows(path), torch.from_numpy(converted).to(torch.bfloat16)
    ids = torch.arange(95, -1, -1)
    assert torch.equal(rows.all(), expected) and torch.equal(rows.rows(ids), expected[ids])


def test_another_type_gives_none_and_a_damaged_file_is_named(tmp_path):
    path, _ = write_gguf(tmp_path / "q4.gguf", gguf.GGMLQuantizationType.Q4_1)
    assert gguf_io.read_q8_rows(path) is None, "not Q8_0: the loaded weights serve instead"
    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes(write_gguf(tmp_path / "m.gguf")[0].read_bytes()[:100])
    with pytest.raises(CheckpointError, match="damaged.gguf"):
        gguf_io.read_q8_rows(damaged)


def test_ids_outside_the_rows_and_a_file_cut_short_are_refused(tmp_path):
    path, _ = write_gguf(tmp_path / "m.gguf")
    rows = gguf_io.read_q8_rows(path)
    with pytest.raises(IndexError, match="96 rows"):
        rows.rows(torch.tensor([3, 96]))
    path.write_bytes(path.read_bytes()[: rows.offset + 10 * rows.row_bytes])  # rows 10.. are gone
    assert rows.rows(torch.tensor([9])).shape == (1, 64)
    with pytest.raises(CheckpointError, match="m.gguf ends inside its embedding"):
        rows.rows(torch.tensor([50]))


@needs_packing
def test_the_packed_head_keeps_no_plain_copy_and_multiplies_as_a_plain_heads_would(tmp_path):
    rows = gguf_io.read_q8_rows(write_gguf(tmp_path / "m.gguf")[0])
    head, plain = q8.PackedQ8(rows), PackedLinear(rows.all())
    assert head.weights == [], "no [V, D] copy beside the packed one"
    for count in (1, 2, 9):
        x = torch.randn(count, 64).to(torch.bfloat16)
        assert torch.equal(head(x), plain(x)), f"{count} rows: the plain head's packed product"
    x = torch.randn(3, 64)
    assert torch.equal(head(x), F.linear(x, rows.all().float())), "float32 input: F.linear, as a plain head"
    x = torch.randn(2, 64).to(torch.bfloat16).requires_grad_()
    head(x).sum().backward()
    assert x.grad is not None and x.grad.shape == (2, 64)


@pytest.fixture(scope="module")
def int4_targets():
    """The embedded int4 target with its embedding from the file's rows, and the same without (the bf16 weight)."""
    import blockdraft.io.targets as targets

    with_rows = targets.load_target(weights="q4")
    read = targets.read_q8_rows
    targets.read_q8_rows = lambda path, **kwargs: None
    try:
        with_weight = targets.load_target(weights="q4")
    finally:
        targets.read_q8_rows = read
    return with_rows, with_weight


@needs_packing
@needs_smollm2
def test_an_int4_target_holds_no_bf16_embedding(int4_targets):
    with_rows, with_weight = int4_targets
    assert isinstance(with_rows.embed_tokens, q8.Q8Embedding) and with_rows.embed_tokens.weight.is_meta
    assert with_rows.lm_head.weight.is_meta and with_rows.model.get_input_embeddings() is with_rows.embed_tokens
    assert not with_weight.embed_tokens.weight.is_meta
    assert (with_rows.dtype, with_rows.device) == (torch.bfloat16, torch.device("cpu"))


@needs_packing
@needs_smollm2
@torch.no_grad()
def test_an_int4_target_over_the_files_rows_computes_what_it_did_over_the_weight(int4_targets):
    with_rows, with_weight = int4_targets
    ids = torch.tensor([[1, 9690, 198, 2683, 314, 253, 1929, 30, 2, 45, 49151, 0]])
    positions = torch.arange(ids.shape[1])[None]
    rows = torch.arange(ids.shape[1])[None]  # every position's logits
    outs = [t.forward(ids, positions, t.new_cache(1, 64), (1, 27), logit_rows=rows) for t in int4_targets]
    assert torch.equal(outs[0].features, outs[1].features) and torch.equal(outs[0].logits, outs[1].logits)
    hidden = outs[0].features[..., -576:]  # any bf16 rows through the head
    assert torch.equal(with_rows.logits(hidden), with_weight.logits(hidden))
    vocab = torch.tensor([0, 5, 700, 49151])
    hidden = torch.randn(2, 3, 576).to(torch.bfloat16)
    assert torch.equal(with_rows.row_head(vocab)(hidden), with_weight.row_head(vocab)(hidden)), "a draft's head"
    assert torch.equal(with_rows.head_rows(vocab), with_weight.head_rows(vocab))
    hf = [t.model(ids).logits for t in int4_targets]  # the HF model's own forward (hf-generate in bench)
    assert torch.equal(hf[0], hf[1])


@needs_packing
@needs_smollm2
def test_an_int4_target_over_the_files_rows_decodes_the_same_tokens(int4_targets):
    from blockdraft.api import encode
    from blockdraft.decode.decoder import Decoder

    prompt = encode(int4_targets[0], "Write a Python function that adds two numbers.")
    tokens = [Decoder(t, None).generate([prompt], max_new_tokens=24)[0].tokens for t in int4_targets]
    assert tokens[0] == tokens[1] and len(tokens[0]) > 0


@needs_packing
@needs_smollm2
def test_rows_that_are_not_the_loaded_weights_bits_leave_the_weight_in_place():
    from blockdraft.io import targets
    from blockdraft.model.target import Target

    class Shifted(q8.Q8Rows):  # a file that is not the one the cached copy was converted from
        def rows(self, ids):
            return super().rows(ids) + 1

    real = targets.read_q8_rows(targets.embedded_gguf_path())
    model = targets.load_embedded_model(targets.embedded_target_folder(), torch.bfloat16, skip_projections=True)
    quantized = targets.q4_blocks(targets.embedded_gguf_path(), model.config)
    with pytest.warns(UserWarning, match="not the loaded weight's bits"):
        target = Target(model, quantized=quantized, embedding=Shifted(real.path, real.offset, *real.shape))
    assert not target.embed_tokens.weight.is_meta and target._rows is None


@needs_packing
@needs_smollm2
def test_an_int4_target_never_reads_the_embedding_its_file_serves(monkeypatch):
    from blockdraft.io import targets

    read = []
    load = targets.load_embedded_model
    monkeypatch.setattr(targets, "load_embedded_model", lambda *a, **k: (read.append(k), load(*a, **k))[1])
    target = targets.load_target(weights="q4")
    assert read == [{"skip_projections": True, "skip_embedding": True}] and target._rows is not None


def test_single_rows_are_kept_and_handed_out_as_copies(tmp_path):
    """A decode step asks one row at a time: the kept row must equal a fresh read, stay bounded in number, and
    survive the caller adding into what it was given (the target's forward does, in place)."""
    path, converted = write_gguf(tmp_path / "m.gguf")
    rows = gguf_io.read_q8_rows(path)
    assert torch.equal(rows.rows(torch.tensor([[5]]))[0, 0], torch.from_numpy(converted[5]).to(torch.bfloat16))
    fresh = rows.rows(torch.tensor([[3, 7]]))  # two ids: read, not kept
    first = rows.rows(torch.tensor([[3]]))
    assert torch.equal(first[0, 0], fresh[0, 0])
    first.add_(1.0)  # the caller's copy
    assert torch.equal(rows.rows(torch.tensor([3]))[0], fresh[0, 0])
    for i in range(q8.KEPT_ROWS + 10):
        rows.rows(torch.tensor([i % rows.shape[0]]))
    assert len(rows._kept) <= q8.KEPT_ROWS
