"""The KD objective (docs/training.md §3): slot k of block j learns the target's distribution at p_j+k-1.

The teacher index is the pitfall: the distribution at p_j+k-1 predicts x[p_j+k], the slot's label; the one at
p_j+k predicts the token after it. Every check compares against a per-slot loop written from the formula.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from blockdraft.train.forward import split_teacher, target_features
from blockdraft.train.objective import block_targets, sample_anchors, teacher_positions, weighted_loss
from blockdraft.train.trainer import train

from tiny_models import VOCAB, tiny_target
from train_fakes import assert_same_update, config, tensors, write_data

B, S, A, K, D = 2, 24, 5, 6, 16


def _case(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (B, S), generator=g)
    mask = torch.ones(B, S, dtype=torch.long)
    mask[:, :5] = 0  # a prompt
    mask[1, 18:] = 0  # a shorter second sequence: blocks past its end are cut
    anchors, keep = sample_anchors(mask, A, g)
    blocks = block_targets(tokens, mask, anchors, keep, K, 4.0)
    hidden = torch.randn(B, A * K, D, generator=g)
    head = torch.randn(VOCAB, D, generator=g)
    teacher = torch.randn(B, S, D, generator=g)
    return blocks, hidden, head, teacher


def _loop(blocks, hidden, head, teacher, kd_weight: float, offset: int = -1) -> torch.Tensor:
    """Σ_{j,k} w·((1-λ)·CE + λ·KD), the teacher of slot k taken at p_j + k + offset."""
    total = torch.zeros(())
    for b in range(B):
        for j in range(A):
            for k in range(K):
                w = blocks.weights[b, j, k]
                if w == 0:
                    continue
                z = head @ hidden[b, j * K + k]
                soft = (head @ teacher[b, blocks.anchors[b, j] + k + offset]).softmax(-1)
                kd = -(soft * z.log_softmax(-1)).sum()
                ce = F.cross_entropy(z[None], blocks.labels[b, j, k][None])
                total = total + w * ((1 - kd_weight) * ce + kd_weight * kd)
    return total


def test_teacher_of_slot_k_is_the_position_before_its_label():
    blocks, hidden, head, teacher = _case()
    positions = teacher_positions(blocks)
    assert torch.equal(positions[..., 1:], blocks.anchors[..., None] + torch.arange(K - 1)), "p_j + k - 1"
    total, _ = weighted_loss(hidden, head, blocks, teacher=teacher, kd_weight=1.0, chunk_rows=7)
    torch.testing.assert_close(total, _loop(blocks, hidden, head, teacher, 1.0), rtol=1e-5, atol=1e-4)
    # The same check notices a teacher one position late (p_j + k): it is not a check that cannot fail.
    assert not torch.isclose(total, _loop(blocks, hidden, head, teacher, 1.0, offset=0), rtol=1e-3)


@pytest.mark.parametrize("kd_weight", [0.0, 0.3, 1.0])
def test_kd_weight_mixes_ce_and_kd(kd_weight):
    blocks, hidden, head, teacher = _case(seed=1)
    total, hits = weighted_loss(hidden, head, blocks, teacher=teacher, kd_weight=kd_weight)
    torch.testing.assert_close(total, _loop(blocks, hidden, head, teacher, kd_weight), rtol=1e-5, atol=1e-4)
    plain, plain_hits = weighted_loss(hidden, head, blocks)
    assert torch.equal(hits, plain_hits), "accuracy is the argmax against the label whatever the loss"
    if kd_weight == 0:
        assert torch.equal(total, plain), "λ = 0 is plain CE"


def test_kd_needs_a_teacher_and_trains_nothing_without_anchors():
    blocks, hidden, head, teacher = _case(seed=2)
    with pytest.raises(ValueError, match="teacher"):
        weighted_loss(hidden, head, blocks, kd_weight=0.5)
    mask = torch.zeros(B, S, dtype=torch.long)
    anchors, keep = sample_anchors(mask, A, torch.Generator().manual_seed(0))
    empty = block_targets(torch.zeros(B, S, dtype=torch.long), mask, anchors, keep, K, 4.0)
    hidden = hidden.clone().requires_grad_(True)
    total, _ = weighted_loss(hidden, head, empty, teacher=teacher, kd_weight=1.0)
    total.backward()
    assert total.item() == 0.0 and torch.equal(hidden.grad, torch.zeros_like(hidden))


def test_tapped_last_layer_gives_the_targets_own_logits():
    """The trainer taps layer N-1 (returned final-normed) for the teacher; the head must turn it into the
    logits the target itself computes."""
    target = tiny_target("llama")
    tokens = torch.randint(3, VOCAB - 1, (2, 12))
    tapped = target_features(target, tokens, (1, 3, target.num_layers - 1))
    features, teacher = split_teacher(tapped, 2 * target.config.hidden_size)
    assert torch.equal(features, target_features(target, tokens, (1, 3)))
    with torch.no_grad():
        reference = target.model(tokens).logits.float()
    torch.testing.assert_close(target.logits(teacher), reference, rtol=1e-5, atol=1e-5)
    assert split_teacher(features, features.shape[-1])[1] is None


def test_kd_training_caches_the_teacher_and_changes_the_update(tmp_path):
    write_data(tmp_path / "data", count=8)
    exact = dict(max_steps=3, lr=1e-4, clip=1e9, micro_batch_size=2)
    online = train(tiny_target("llama"), config(tmp_path, "online", kd_weight=0.5, **exact)).parent
    cached = train(tiny_target("llama"), config(tmp_path, "cached", kd_weight=0.5, cache_features=True,
                                                **exact)).parent
    assert_same_update(online, cached, "the cache must hold the teacher states a fresh forward gives")
    plain = train(tiny_target("llama"), config(tmp_path, "plain", **exact)).parent
    a, b = tensors(online / "checkpoint" / "model.safetensors"), tensors(plain / "checkpoint" / "model.safetensors")
    assert any(not torch.equal(a[n], b[n]) for n in a), "KD must change what the draft learns"
