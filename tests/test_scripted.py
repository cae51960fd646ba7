"""scripted.py: the TorchScript layer loop computes what target.py's Python loop computes, bit for bit."""

from __future__ import annotations

import pytest
import torch

from blockdraft.model import q4, scripted
from blockdraft.model.target import Target
from tiny_models import tiny_target



def int4_target(family: str) -> Target:
    """A tiny bf16 target of `family` whose projections run over Q4_1 blocks of its own weights."""
    import gguf

    model = tiny_target(family, layers=3).model.bfloat16()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # decisive argmaxes
    layers = []
    for layer in model.model.layers:
        modules = {n: getattr(layer.self_attn, f"{n}_proj") for n in ("q", "k", "v", "o")}
        modules |= {n: getattr(layer.mlp, f"{n}_proj") for n in ("gate", "up", "down")}
        layers.append({n: q4.Q4Blocks(torch.from_numpy(gguf.quants.quantize(m.weight.detach().float().numpy(),
                                                                            gguf.GGMLQuantizationType.Q4_1)))
                       for n, m in modules.items()})
    return Target(model, quantized=layers)


def both_loops(target: Target, *args, **kwargs):
    """The forward's outputs and cache with the TorchScript loop, then with the Python loop, from the same cache."""
    assert target.run_layers == target._scripted_layers, "this target's forward must take the TorchScript loop"
    results = []
    for runner in (target._scripted_layers, target._layers):
        cache = target.new_cache(2, 40)
        original, target.run_layers = target.run_layers, runner
        try:
            with torch.inference_mode():
                prefill = target.forward(torch.arange(2 * 11).view(2, 11) % 90 + 3, torch.arange(11).expand(2, 11),
                                         cache, (0, 1), logit_rows=torch.arange(11).expand(2, 11))
                out = target.forward(*args, cache=cache, **kwargs)
        finally:
            target.run_layers = original
        results.append((prefill, out, cache))
    return results


def assert_same(results):
    (prefill_a, out_a, cache_a), (prefill_b, out_b, cache_b) = results
    for a, b in ((prefill_a, prefill_b), (out_a, out_b)):
        assert torch.equal(a.logits, b.logits), "the TorchScript loop must give the Python loop's logits, bit for bit"
        assert (a.features is None) == (b.features is None)
        if a.features is not None:
            assert torch.equal(a.features, b.features), "tapped features must be the Python loop's"
    for layer in range(len(cache_a.keys)):
        assert torch.equal(cache_a.keys[layer], cache_b.keys[layer]) and torch.equal(cache_a.values[layer],
                                                                                      cache_b.values[layer])


STEPS = {  # (input ids [2, T], positions [2, T], extra forward arguments)
    "one token": lambda: (torch.tensor([[5], [9]]), torch.tensor([[11], [11]]), {}),
    # at the span's last slot every slot is visible: no mask at all, which is not a causal prefill
    "one token seeing every slot": lambda: (torch.tensor([[5], [9]]), torch.tensor([[15], [15]]), {}),
    "a verify block, ragged rows": lambda: (torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]]),
                                             torch.tensor([[11, 12, 13, 14], [8, 9, 10, 11]]), {}),
    "a ragged chain: each row's own tokens": lambda: (torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]]),
                                                       torch.tensor([[11, 12, 13, 14], [8, 9, 10, 11]]),
                                                       {"widths": torch.tensor([2, 4])}),
    "a token tree": lambda: (torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]]), torch.tensor([[11, 12, 12, 13]] * 2),
                             {"slots": torch.tensor([[11, 12, 13, 14]] * 2),
                              "block_mask": torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]],
                                                         dtype=torch.bool).expand(2, 4, 4)}),
}


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("taps", [(), (0, 2), (1,)])
def test_scripted_loop_is_the_python_loop(family, step, taps):
    ids, positions, extra = STEPS[step]()
    rows = torch.arange(ids.shape[1]).expand(2, -1)
    assert_same(both_loops(int4_target(family), ids, positions, tap_layer_ids=taps, logit_rows=rows, **extra))


def test_a_wrong_scripted_op_would_be_seen(monkeypatch):
    # The comparison above can fail: a loop whose output is off in one feature gives other logits.
    target = int4_target("llama")
    original = scripted.run_layers

    def off_in_one_feature(x, *args):
        out, taps = original(x, *args)
        out[:, 0] += 0.5
        return out, taps

    monkeypatch.setattr(scripted, "scripted_run_layers", lambda: off_in_one_feature)
    ids, positions, _ = STEPS["one token"]()
    with pytest.raises(AssertionError, match="logits"):
        assert_same(both_loops(target, ids, positions, logit_rows=torch.zeros(2, 1, dtype=torch.long)))


def test_targets_outside_its_reach_keep_the_python_loop():
    target = tiny_target("llama")
    assert target.run_layers == target._layers, "a float32 target's products are not int4: the Python loop runs"
    packed = Target(tiny_target("llama").model.bfloat16(), pack_weights=True)
    assert packed.run_layers == packed._layers, "packed bf16 neither"


def test_the_loop_compiles_with_torchscript():
    assert scripted.scripted_run_layers() is not scripted.run_layers, "TorchScript must compile the loop here"


def test_each_twin_computes_its_originals_bits():
    """The TorchScript twins (scripted.py) against the Python loop's own functions, on bf16 rows: a twin that drifted
    from its original would make the two loops differ in ways the whole-loop tests above may not reach."""
    from blockdraft.model import lean

    generator = torch.Generator().manual_seed(5)
    x = torch.randn(6, 64, generator=generator).bfloat16()
    weight = (1 + 0.1 * torch.randn(64, generator=generator)).bfloat16()
    eps, width = torch.tensor(1e-5), torch.tensor(64.0)
    assert torch.equal(scripted.rms_norm_twin(x, weight, eps, width), lean.rms_norm(x, weight, eps, width))
    heads = torch.randn(2, 3, 4, 16, generator=generator).bfloat16()
    c, s = (torch.randn(2, 1, 4, 16, generator=generator).bfloat16() for _ in range(2))
    assert torch.equal(scripted.rotate_twin(heads, c, s), lean.rotate(heads, c, s))
    target = int4_target("llama")
    weight4 = target.linears[0]["qkv"].weight
    for count in (1, 4, 5, 9, 17, 65):  # 5, 9 and 17 rows run their last row apart
        rows = torch.randn(count, weight4.in_features, generator=generator).bfloat16()
        assert torch.equal(scripted.int4_product_twin(rows, weight4.packed, weight4.scales_zeros, q4.BLOCK),
                           q4.int4_product(rows, weight4)), f"{count} rows"
