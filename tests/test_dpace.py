"""D-PACE slot weights (docs/training.md §3): w_k = v_k · sg[Σ_{m=k}^{K-1} v_m Π_{i=1}^{m} q̃_i], q̃_i = (1-α)e^{-CE_i} + α."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from blockdraft.train.objective import block_targets, dpace_weights, sample_anchors, weighted_loss
from blockdraft.train.settings import TrainConfig
from blockdraft.train.trainer import train

from tiny_models import VOCAB, tiny_target
from train_fakes import config, tensors, write_data

K = 6


def _loop(ce, valid, alpha):
    """The formula, slot by slot, for one block."""
    q = [(1 - alpha) * math.exp(-float(c)) + alpha for c in ce]
    out = []
    for k in range(K):
        tail = sum(float(valid[m]) * math.prod(q[1 : m + 1]) for m in range(max(k, 1), K))
        out.append(float(valid[k]) * tail)
    return out


@pytest.mark.parametrize("alpha", [0.0, 0.5, 0.9])
def test_weights_follow_the_formula(alpha):
    g = torch.Generator().manual_seed(0)
    ce = torch.rand(4, K, generator=g) * 4
    valid = torch.tensor([[0, 1, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0], [0, 1, 1, 1, 1, 0]]).float()
    weights = dpace_weights(ce, valid, alpha)
    for row in range(4):
        assert weights[row].tolist() == pytest.approx(_loop(ce[row], valid[row], alpha), rel=1e-5, abs=1e-7)
    assert (weights[:, 0] == 0).all() and (weights[2] == 0).all() and (weights[1, 3:] == 0).all()


def test_a_perfect_draft_weighs_each_slot_by_the_slots_that_need_it():
    valid = torch.tensor([[0, 1, 1, 1, 1, 1]]).float()
    assert dpace_weights(torch.zeros(1, K), valid).tolist() == [[0, 5, 4, 3, 2, 1]]
    shrinking = dpace_weights(torch.full((1, K), 3.0), valid)[0]
    assert all(a > b for a, b in zip(shrinking[1:], shrinking[2:])), "later slots weigh less when slots miss"


def test_weighted_loss_uses_dpace_without_a_gradient_through_the_weights():
    g = torch.Generator().manual_seed(1)
    B, S, A, D = 2, 20, 4, 8
    tokens = torch.randint(0, VOCAB, (B, S), generator=g)
    mask = torch.ones(B, S, dtype=torch.long)
    mask[:, :3] = 0
    anchors, keep = sample_anchors(mask, A, g)
    blocks = block_targets(tokens, mask, anchors, keep, K, math.inf)
    assert set(blocks.weights.unique().tolist()) <= {0.0, 1.0}, "gamma = inf leaves the plain validity v"
    hidden = torch.randn(B, A * K, D, generator=g, requires_grad=True)
    head = torch.randn(VOCAB, D, generator=g)
    total, _ = weighted_loss(hidden, head, blocks, chunk_rows=5, dpace_alpha=0.5)
    total.backward()
    # The same sum with the weights computed outside the graph: equal value and equal gradient.
    h = hidden.detach().clone().requires_grad_(True)
    ce = F.cross_entropy((h @ head.T).view(-1, VOCAB), blocks.labels.reshape(-1), reduction="none").view(B, A, K)
    weights = dpace_weights(ce.detach() * (blocks.weights > 0), blocks.weights, 0.5)
    expected = (weights * ce).sum()
    expected.backward()
    torch.testing.assert_close(total, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hidden.grad, h.grad, rtol=1e-5, atol=1e-6)
    plain, _ = weighted_loss(hidden, head, blocks)
    assert not torch.isclose(total, plain), "D-PACE must change the loss"


def test_dpace_training_runs_and_refuses_bad_settings(tmp_path):
    write_data(tmp_path / "data", count=8)
    out = train(tiny_target("llama"), config(tmp_path, weighting="dpace", max_steps=2, log_every=1))
    assert (out / "model.safetensors").exists()
    # The same two steps with the weights D-PACE starts from (validity alone, gamma = inf) and no D-PACE factors:
    # a trainer that dropped the setting, or its factors, would write the same draft.
    plain = train(tiny_target("llama"), config(tmp_path, name="plain", gamma=math.inf, max_steps=2, log_every=1))
    dpace, decayed = tensors(out / "model.safetensors"), tensors(plain / "model.safetensors")
    assert any(not torch.equal(dpace[n], decayed[n]) for n in dpace), "weighting='dpace' changed no update"
    with pytest.raises(Exception, match="weighting"):
        TrainConfig(data_dirs=tmp_path, out_dir=tmp_path, weighting="linear")
    with pytest.raises(Exception, match="dpace_alpha"):
        TrainConfig(data_dirs=tmp_path, out_dir=tmp_path, weighting="dpace", dpace_alpha=1.5)
