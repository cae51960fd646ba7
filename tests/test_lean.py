"""lean.py: the target layer's small ops equal the Hugging Face modules they replace, bit for bit."""

from __future__ import annotations

import pytest
import torch

from blockdraft.model.lean import activation_function, gated, norm_function, residual, rms_norm, rope_tables, rotate
from tiny_models import tiny_target

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [64, 100, 576])  # vector-aligned, with a tail, and SmolLM2's hidden size
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_rms_norm_is_the_hf_norm_bit_for_bit(dtype, width, family):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    module = (LlamaRMSNorm if family == "llama" else Qwen3RMSNorm)(width, eps=1e-5).to(dtype)
    with torch.no_grad():
        module.weight.uniform_(0.5, 1.5)  # not all ones: the weight's product must be the module's too
    x = (torch.randn(3, 100, width) * 4).to(dtype)  # rows of any count: one step's and a prefill's
    before = x.clone()
    with torch.no_grad():
        expected = module(x)
        assert torch.equal(rms_norm(x, module.weight, module.variance_epsilon), expected)
        assert torch.equal(norm_function(module)(x), expected)
        assert torch.equal(norm_function(module)(x[:, :1]), expected[:, :1]), "one row must norm as in a block"
    assert torch.equal(x, before), "the input must be left as it was"


def test_rms_norm_keeps_a_gradient_path():
    # Scaling in place would break the saved input of h * h: a backward through the norm must still work and agree
    # (to rounding: h * h and HF's pow(2) differentiate in other orders).
    module = tiny_target("llama").model.model.norm
    x = torch.randn(2, 4, module.weight.shape[0], requires_grad=True)
    rms_norm(x, module.weight, module.variance_epsilon).sum().backward()
    ours = x.grad.clone()
    x.grad = None
    module(x).sum().backward()
    torch.testing.assert_close(ours, x.grad, atol=1e-6, rtol=1e-5)


def test_an_unknown_norm_keeps_its_own_module():
    class OnePlusNorm(torch.nn.Module):  # Gemma-style: not the formula rms_norm computes
        variance_epsilon = 1e-6

        def forward(self, x):
            return x

    module = OnePlusNorm()
    assert norm_function(module) is module


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_tables_rotate_with_the_hf_functions_bits(dtype):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    target = tiny_target("llama")
    positions = torch.tensor([[0, 5, 17, 300], [1, 2, 3, 511]])
    x = torch.randn(2, 4, target.config.hidden_size).to(dtype)
    cos, sin = target.rotary(x, positions)  # [B, T, Dh]
    q, k = torch.randn(2, 4, 4, 16).to(dtype), torch.randn(2, 2, 4, 16).to(dtype)  # [B, H, T, Dh]
    expected_q, expected_k = apply_rotary_pos_emb(q, k, cos, sin)
    c, s = rope_tables(cos, sin)
    before = q.clone()
    assert torch.equal(rotate(q, c, s), expected_q)
    assert torch.equal(rotate(k, c, s), expected_k)
    assert torch.equal(q, before), "rotate must not write into its input"


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_activation_is_the_mlp_s(dtype):
    mlp = tiny_target("llama").model.model.layers[0].mlp
    act = activation_function(mlp)
    gate, up = torch.randn(2, 3, 8).to(dtype), torch.randn(2, 3, 8).to(dtype)
    assert torch.equal(gated(act, gate, up), mlp.act_fn(gate) * up)


def test_residual_adds_in_place_only_when_nothing_else_reads_x():
    x, update = torch.zeros(2, 3), torch.ones(2, 3)
    kept = residual(x, update, keep=True)
    assert kept is not x and not x.any(), "a kept x (a tapped layer's output) must stay as it was"
    assert residual(x, update, keep=False) is x and x.eq(1).all()


@pytest.mark.parametrize("taps", [(0, 1), (1, 2, 5), (5,)])
def test_features_under_no_grad_are_the_hf_hidden_states(taps):
    # Without a gradient the residuals add in place; adjacent taps must still each hold their own layer's output.
    target = tiny_target("llama", layers=6)
    ids = torch.randint(0, 90, (2, 9))
    with torch.no_grad():
        hf = target.model(ids, output_hidden_states=True)
        out = target.forward(ids, torch.arange(9).expand(2, 9), target.new_cache(2, 16), taps,
                             logit_rows=torch.arange(9).expand(2, 9))
    expected = [hf.hidden_states[i + 1] for i in taps]
    if 5 in taps:  # the last layer's output is taken post-norm, as HF's last hidden state
        expected[-1] = hf.hidden_states[-1]
    assert torch.equal(out.features, torch.cat(expected, dim=-1))
    torch.testing.assert_close(out.logits, hf.logits.float(), atol=1e-5, rtol=1e-5)
