"""`blockdraft export --to gguf`: the DFlash draft file llama.cpp loads (blockdraft/io/gguf_draft.py).

The file must carry what llama.cpp's own converter writes (conversion/qwen.py `DFlashModel`): the same tensor
names, types and bytes, `target_layers` shifted by one, the block size and mask id, and the target's tokenizer;
a proposal vocabulary becomes `d2t` plus the target head's own rows. The last test loads the file in llama.cpp.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import replace

import numpy as np
import pytest
import torch

from blockdraft.cli import main
from blockdraft.errors import CheckpointError
from blockdraft.io.gguf_draft import (gguf_name, gguf_problems, read_gguf_draft, write_gguf_draft)
from tiny_models import VOCAB, needs_smollm2, tiny_draft, tiny_target

gguf = pytest.importorskip("gguf")

# The shipped draft's file as llama.cpp's converter (llama-cpp-python 0.3.36) wrote it, checked by hand once.
SHIPPED_FIELDS = {"general.architecture": "dflash", "dflash.block_count": 2, "dflash.embedding_length": 576,
                  "dflash.feed_forward_length": 1536, "dflash.attention.head_count": 9,
                  "dflash.attention.head_count_kv": 3, "dflash.attention.key_length": 64,
                  "dflash.rope.freq_base": 100000.0, "dflash.block_size": 8, "dflash.target_layers": [2, 28],
                  "tokenizer.ggml.mask_token_id": 16, "general.file_type": 1}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny draft and a GGUF of its target: llama fields, a tokenizer of VOCAB entries, an f32 head."""
    target = tiny_target()
    draft = tiny_draft(target, layers=2, block_size=8)
    path = tmp_path_factory.mktemp("gguf") / "target.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("llama.embedding_length", target.config.hidden_size)
    writer.add_uint32("llama.block_count", target.config.num_hidden_layers)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(VOCAB)])
    writer.add_array("tokenizer.ggml.token_type", [1] * VOCAB)
    head = target.lm_head.weight.detach().float().numpy()  # [V, D]
    writer.add_tensor("output.weight", head)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return draft.config, draft.state_dict(), path, head


def fields_of(path) -> dict:
    return {f.name: f.contents() for f in gguf.GGUFReader(path).fields.values()}


def test_every_draft_tensor_has_llama_cpp_name(tiny):
    cfg, tensors, _, _ = tiny
    names = {gguf_name(n) for n in tensors}
    assert len(names) == len(tensors), "two of our tensors map to one llama.cpp name: one would overwrite the other"
    assert {"fc.weight", "enc.output_norm.weight", "output_norm.weight", "blk.1.attn_output.weight",
            "blk.0.ffn_down.weight", "blk.0.attn_q_norm.weight"} <= names
    with pytest.raises(CheckpointError, match="no place"):
        gguf_name("layers.0.self_attn.q_proj.bias")


def test_options_llama_cpp_lacks_are_refused(tiny):
    cfg = tiny[0]
    assert gguf_problems(cfg) == []
    layer_types = ("sliding_attention",) + cfg.layer_types[1:]
    bad = replace(cfg, attention_bias=True, layer_types=layer_types, sliding_window=64)
    problems = gguf_problems(bad)
    assert len(problems) == 2 and "attention_bias" in problems[0] and "layer_types" in problems[1]


def test_file_holds_the_draft_and_target_tokenizer(tiny, tmp_path):
    cfg, tensors, target_path, _ = tiny
    out = tmp_path / "draft.gguf"
    write_gguf_draft(out, cfg, tensors, target_path, "f32")
    fields = fields_of(out)
    assert fields["dflash.target_layers"] == [i + 1 for i in cfg.target_layer_ids], "llama.cpp taps layer inputs"
    assert fields["dflash.block_size"] == cfg.block_size and fields["tokenizer.ggml.mask_token_id"] == VOCAB - 1
    assert fields["tokenizer.ggml.tokens"] == [f"t{i}" for i in range(VOCAB)], "llama.cpp compares vocabularies"
    stored = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(out).tensors}
    for name, tensor in tensors.items():
        assert np.array_equal(stored[gguf_name(name)], tensor.float().numpy()), f"{name} changed on the way"
    assert "output.weight" not in stored and "d2t" not in stored, "a full-vocabulary draft uses the target's head"


def test_proposal_vocabulary_becomes_d2t_and_head_rows(tiny, tmp_path):
    cfg, tensors, target_path, head = tiny
    vocab = torch.tensor([0, 3, 7, VOCAB - 1])
    out = tmp_path / "draft.gguf"
    write_gguf_draft(out, cfg, tensors, target_path, "f16", vocab)
    stored = {t.name: t for t in gguf.GGUFReader(out).tensors}
    assert stored["d2t"].tensor_type == gguf.GGMLQuantizationType.I64, "llama.cpp asserts an int64 d2t"
    assert np.asarray(stored["d2t"].data).tolist() == vocab.tolist()
    assert np.array_equal(np.asarray(stored["output.weight"].data), head[vocab.numpy()]), "rows of another id"
    assert stored["fc.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    assert read_gguf_draft(out)["draft_vocab"] == 4


def test_target_of_another_shape_is_refused(tiny, tmp_path):
    cfg, tensors, target_path, _ = tiny
    wrong = replace(cfg, num_target_layers=cfg.num_target_layers + 1,
                    target_layer_ids=cfg.target_layer_ids)
    with pytest.raises(CheckpointError, match="not this draft's target"):
        write_gguf_draft(tmp_path / "x.gguf", wrong, tensors, target_path)


def test_inspect_refuses_a_gguf_that_is_no_draft(tiny):
    with pytest.raises(CheckpointError, match="not a DFlash draft"):
        read_gguf_draft(tiny[2])


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    out = tmp_path_factory.mktemp("shipped") / "draft.gguf"
    assert main(["export", str(out), "--to", "gguf"]) == 0
    return out


@needs_smollm2
def test_shipped_draft_matches_llama_cpp_converter(shipped):
    fields = fields_of(shipped)
    assert {k: fields[k] for k in SHIPPED_FIELDS} == SHIPPED_FIELDS
    info = read_gguf_draft(shipped)
    assert info["tensors"]["blk.0.attn_q.weight"] == ("F16", [576, 576])
    assert info["tensors"]["enc.output_norm.weight"] == ("F32", [576])
    # The reduced head is the target's own Q8_0 rows, as stored: the same arithmetic as the target's head.
    assert info["tensors"]["output.weight"][0] == "Q8_0" and info["draft_vocab"] > 1000


@needs_smollm2
def test_export_refuses_bad_outputs(shipped, tmp_path, capsys):
    size = shipped.stat().st_size
    assert main(["export", str(shipped), "--to", "gguf"]) != 0
    assert "exists" in capsys.readouterr().err and shipped.stat().st_size == size, "an export overwrote a file"
    assert main(["export", str(tmp_path / "draft.bin"), "--to", "gguf"]) != 0
    assert "does not end in .gguf" in capsys.readouterr().err


@needs_smollm2
def test_llama_cpp_loads_the_export(shipped):
    """The round trip: llama.cpp's DFlash loader reads our file with the right taps, block size and vocabulary.
    Needs llama-cpp-python (a source build of several minutes, so not installed in CI)."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional)")
    lines: list[str] = []

    @llama_cpp.llama_log_callback
    def collect(level, text, user_data):
        lines.append(text.decode(errors="replace"))

    llama_cpp.llama_log_set(collect, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(str(shipped).encode(), llama_cpp.llama_model_default_params())
    try:
        assert model, "llama.cpp refused the file:\n" + "".join(lines[-20:])
        log = "".join(lines)
        assert "DFlash extract_layers = [2, 28]" in log
        assert re.search(r"dflash\.block_size\s+u32\s+=\s+8", log)
        assert re.search(r"draft_vocab_size = \d+", log), "llama.cpp ignored the proposal vocabulary"
        assert llama_cpp.llama_model_n_layer(model) == 2
    finally:
        if model:
            llama_cpp.llama_model_free(model)
        llama_cpp.llama_log_set(ctypes.cast(0, llama_cpp.llama_log_callback), ctypes.c_void_p(0))


def test_draft_of_another_target_needs_its_gguf(tiny, tmp_path, capsys):
    from blockdraft.io.checkpoint import write_checkpoint

    cfg, tensors, target_path, _ = tiny
    folder = tmp_path / "draft"
    write_checkpoint(folder, cfg, tensors)
    out = tmp_path / "draft.gguf"
    assert main(["export", str(folder), str(out), "--to", "gguf"]) != 0
    assert "--target-gguf" in capsys.readouterr().err, "the fix must be named"
    assert main(["export", str(folder), str(out), "--to", "gguf", "--target-gguf", str(target_path)]) == 0
    assert read_gguf_draft(out)["draft_vocab"] is None
