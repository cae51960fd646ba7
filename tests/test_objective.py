"""The training objective (docs/training.md §2, §6 tests 1-8) on tiny fp32 targets.

The spine is test 1: the training path (all blocks at once under the anchor mask) must compute exactly what
the decoder computes for each block alone, or the draft learns a task it never faces at inference.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from blockdraft.config import DraftConfig, default_target_layer_ids, gamma_for_block_size
from blockdraft.decode.drafter import Drafter
from blockdraft.errors import ConfigError
from blockdraft.train.batches import make_micro_batch, seeded_generator
from blockdraft.train.data import Example
from blockdraft.train.evaluate import BlockMetrics
from blockdraft.train.forward import target_features
from blockdraft.train.objective import (
    anchor_candidates,
    block_targets,
    block_tau,
    decay_weights,
    draft_hidden,
    sample_anchors,
    weighted_loss,
)

from tiny_models import VOCAB, tiny_draft, tiny_target

K = 16
ANCHORS = [3, 9, 10, 17, 25]  # overlapping blocks (9, 10) and blocks running past the end (25 + 15 > S)
PADDED = 3
S = 32


def _setup(family: str):
    target = tiny_target(family)
    draft = tiny_draft(target, layers=2, block_size=K)
    torch.manual_seed(3)
    tokens = torch.randint(3, VOCAB - 1, (1, S))
    features = target_features(target, tokens, draft.config.target_layer_ids)
    anchors = torch.tensor([ANCHORS + [0] * PADDED])
    keep = torch.tensor([[True] * len(ANCHORS) + [False] * PADDED])
    return target, draft, tokens, features, anchors, keep


def _inference_block(draft, target, tokens, features, p):
    """The decoder's uncached forward of one block: context F[:p] at 0..p-1, block at p..p+K-1, no mask."""
    ctx = draft.project_context(features[:, :p])
    ctx_kv = draft.context_kv(ctx, torch.arange(p)[None])
    block = torch.full((1, K), draft.config.mask_token_id)
    block[0, 0] = tokens[0, p]
    mask = torch.ones(1, K, p + K, dtype=torch.bool)
    return draft(target.embed_tokens(block), p + torch.arange(K)[None], ctx_kv, mask)[0]  # [K, D]


@pytest.mark.parametrize("dense", [False, True], ids=["factored-mask", "dense-mask"])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
@torch.no_grad()
def test_training_path_equals_inference_per_block(family, dense):
    target, draft, tokens, features, anchors, keep = _setup(family)
    hidden = draft_hidden(draft, target.embed_tokens, features, tokens, anchors, keep, K, dense=dense)
    hidden = hidden.view(-1, K, 64)
    for j, p in enumerate(ANCHORS):
        expected = _inference_block(draft, target, tokens, features, p)
        err = (hidden[j] - expected).abs().max().item()
        assert err < 1e-5, f"block at {p}: training path differs from inference by {err:.2e} (mask or positions bug)"
    assert torch.isfinite(hidden).all(), "padded blocks must stay finite (no empty attention rows)"


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@torch.no_grad()
def test_cached_decoder_path_equals_training_path(family):
    target, draft, tokens, features, anchors, keep = _setup(family)
    hidden = draft_hidden(draft, target.embed_tokens, features, tokens, anchors, keep, K).view(-1, K, 64)
    drafter = Drafter(draft, target)
    drafter.start(1, S + K)
    fed = 0
    for j, p in enumerate(ANCHORS):
        # Append only the newly committed context (p - fed positions), as the decode loop does; the previous
        # block's keys/values were never stored, so the cache is at length p.
        drafter.append_context(features[:, fed:p], torch.tensor([p - fed]))
        fed = p
        logits = drafter.propose(tokens[:, p], torch.tensor([p]))[0]  # [K-1, V]
        expected = target.logits(hidden[j, 1:])
        err = (logits - expected).abs().max().item()
        assert err < 1e-4, f"block at {p}: cached draft logits differ from a full recompute by {err:.2e}"


def test_factored_and_dense_masks_give_the_same_gradients():
    target, draft, tokens, features, anchors, keep = _setup("qwen3")
    grads = []
    for dense in (False, True):
        draft.zero_grad(set_to_none=True)
        hidden = draft_hidden(draft, target.embed_tokens, features, tokens, anchors, keep, K, dense=dense)
        (hidden * torch.linspace(-1, 1, hidden.numel()).view_as(hidden)).sum().backward()
        grads.append({n: p.grad.clone() for n, p in draft.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        scale = float(grads[1][name].abs().max())  # fp32 summation order differs: tolerance relative to size
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-6 * scale, msg=name)


def test_bf16_autocast_training_path_follows_float32():
    """CPU training runs the factored attention under bf16 autocast, its softmax in bf16: states and gradients
    stay within bf16 rounding of float32's, padded blocks (no context at all) included."""
    target, draft, tokens, features, anchors, keep = _setup("qwen3")
    weights = torch.linspace(-1, 1, len(ANCHORS + [0] * PADDED) * K * 64).view(1, -1, 64)
    results = []
    for dtype in (None, torch.bfloat16):
        draft.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            hidden = draft_hidden(draft, target.embed_tokens, features, tokens, anchors, keep, K)
        (hidden.float() * weights).sum().backward()
        results.append((hidden.float(), {n: p.grad.clone() for n, p in draft.named_parameters() if p.grad is not None}))
    (h32, g32), (h16, g16) = results
    assert torch.isfinite(h16).all()
    assert (h16 - h32).abs().max() < 0.05 * h32.abs().max(), "bf16 training states drift past bf16 rounding"
    for name, grad in g32.items():
        err = (g16[name] - grad).norm() / grad.norm()
        assert err < 0.05, f"{name}: bf16 gradient off by {err:.3f} of its norm"


@pytest.mark.parametrize("dense", [False, True], ids=["factored-mask", "dense-mask"])
@torch.no_grad()
def test_leaky_mask_differs(dense):
    target, draft, tokens, features, anchors, keep = _setup("qwen3")
    leaky = draft_hidden(draft, target.embed_tokens, features, tokens, anchors, keep, K, leaky=True, dense=dense)
    leaky = leaky.view(-1, K, 64)
    worst = max((leaky[j] - _inference_block(draft, target, tokens, features, p)).abs().max().item()
                for j, p in enumerate(ANCHORS))
    assert worst > 1e-3, "letting a block see its own anchor's feature (c <= p) must change the output"


def test_labels_and_weights():
    tokens = torch.arange(100, 120)[None]  # x[i] = 100 + i, S = 20
    mask = torch.ones(1, 20, dtype=torch.long)
    mask[0, :3] = 0  # prompt
    mask[0, 8] = 0  # one unsupervised token inside the response
    anchors, keep = torch.tensor([[3, 10, 16, 0]]), torch.tensor([[True, True, True, False]])
    blocks = block_targets(tokens, mask, anchors, keep, 8, 4.0)
    decay = decay_weights(8, 4.0)
    assert blocks.labels[0, 0].tolist() == list(range(103, 111)), "slot k of the block at p must be x[p + k]"
    assert (blocks.weights[..., 0] == 0).all(), "slot 0 (the anchor itself) never counts"
    assert blocks.weights[0, 0, 1] == 1.0 and blocks.weights[0, 1, 1] == 1.0
    # Block at 3: slots 1..4 are 4..7, slot 5 is position 8 (unsupervised): it and everything after count 0.
    assert torch.equal(blocks.weights[0, 0], torch.cat([decay[:5], torch.zeros(3)]))
    # Block at 16: positions 17..19 exist, 20+ are past S.
    assert torch.equal(blocks.weights[0, 2], torch.cat([decay[:4], torch.zeros(4)]))
    assert blocks.labels[0, 2, 4:].tolist() == [0] * 4, "labels past the end are 0 (and weightless)"
    assert (blocks.weights[0, 3] == 0).all(), "a padded block has no weight"


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@torch.no_grad()
def test_features_are_layer_outputs(family):
    target = tiny_target(family)
    layers = target.model.model.layers
    outputs = {}
    hooks = [layer.register_forward_hook(lambda m, i, o, n=n: outputs.__setitem__(n, o))
             for n, layer in enumerate(layers)]
    tokens = torch.randint(3, VOCAB - 1, (2, 11))
    hf = target.model(tokens, output_hidden_states=True)
    for hook in hooks:
        hook.remove()
    N = len(layers)
    for i in range(N - 1):
        assert torch.equal(hf.hidden_states[i + 1], outputs[i]), f"hidden_states[{i + 1}] must be layer {i}'s output"
    assert torch.equal(hf.hidden_states[N], target.model.model.norm(outputs[N - 1])), "the last entry is post-norm"
    ids = (0, 2)
    features = target_features(target, tokens, ids)
    torch.testing.assert_close(features, torch.cat([outputs[0], outputs[2]], dim=-1), rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_all_invalid_gives_zero_loss_and_zero_grads(family):
    target = tiny_target(family)
    draft = tiny_draft(target, layers=2, block_size=8).train()
    tokens = torch.randint(3, VOCAB - 1, (2, 20))
    mask = torch.zeros(2, 20, dtype=torch.long)
    anchors, keep = sample_anchors(mask, 6, torch.Generator().manual_seed(0))
    assert not keep.any()
    blocks = block_targets(tokens, mask, anchors, keep, 8, 4.0)
    features = target_features(target, tokens, draft.config.target_layer_ids)
    hidden = draft_hidden(draft, target.embed_tokens, features, tokens, anchors, keep, 8)
    assert torch.isfinite(hidden).all(), "padded blocks attend to their own block only: never an empty row"
    total, hits = weighted_loss(hidden, target.lm_head.weight, blocks)
    assert torch.isfinite(total) and total.item() == 0.0 and not hits.any()
    total.backward()
    for name, param in draft.named_parameters():
        assert param.grad is not None, f"{name} got no gradient: DDP would hang on a rank without anchors"
        assert torch.equal(param.grad, torch.zeros_like(param)), f"{name} has a nonzero gradient from zero weight"


@pytest.mark.parametrize("kd_weight", [0.0, 0.5])
def test_recomputed_head_chunks_give_the_same_loss_and_gradients_in_a_chunks_memory(kd_weight):
    # Kept logits cost rows x V floats (and under KD as much again twice); recomputed ones a chunk's worth.
    g = torch.Generator().manual_seed(2)
    B, S, A, D, V = 2, 40, 6, 16, 4096
    tokens = torch.randint(0, V, (B, S), generator=g)
    mask = torch.ones(B, S, dtype=torch.long)
    anchors, keep = sample_anchors(mask, A, g)
    blocks = block_targets(tokens, mask, anchors, keep, 8, 4.0)
    head = torch.randn(V, D, generator=g)
    teacher = torch.randn(B, S, D, generator=g)
    start = torch.randn(B, A * 8, D, generator=g)
    results = {}
    for recompute in (False, True):
        hidden = start.clone().requires_grad_(True)
        saved = []

        def pack(tensor):
            saved.append(tensor.numel() * tensor.element_size())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            total, hits = weighted_loss(hidden, head, blocks, chunk_rows=8, teacher=teacher, kd_weight=kd_weight,
                                        recompute=recompute)
        total.backward()
        results[recompute] = (total.detach(), hits, hidden.grad, sum(saved))
    (plain, plain_hits, plain_grad, plain_bytes), (again, again_hits, again_grad, again_bytes) = results.values()
    torch.testing.assert_close(again, plain)
    torch.testing.assert_close(again_grad, plain_grad)
    assert torch.equal(again_hits, plain_hits)
    rows = int((blocks.weights > 0).sum())
    assert plain_bytes >= 2 * rows * V * 4, "kept: logits and log-softmax of every supervised row"
    assert again_bytes < rows * V * 4 / 4, "recomputed: the chunks' inputs, not their logits"


def _candidate_sets(mask):
    return [set(row.nonzero()[:, 0].tolist()) for row in anchor_candidates(mask)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 1), min_size=1, max_size=40), min_size=1, max_size=4),
       st.integers(1, 24), st.integers(0, 2**31))
def test_sampler_properties(rows, num_anchors, seed):
    width = max(map(len, rows))
    mask = torch.tensor([row + [0] * (width - len(row)) for row in rows])  # right padding has mask 0
    anchors, keep = sample_anchors(mask, num_anchors, torch.Generator().manual_seed(seed))
    assert anchors.shape == keep.shape == (len(rows), num_anchors)
    for b, candidates in enumerate(_candidate_sets(mask)):
        chosen = anchors[b][keep[b]].tolist()
        assert len(chosen) == min(num_anchors, len(candidates)), "count must be min(A, |C|)"
        assert set(chosen) <= candidates, "anchors must come from C (m[p] = m[p+1] = 1)"
        assert chosen == sorted(set(chosen)), "anchors must be distinct and sorted"
        assert not keep[b, len(chosen):].any() and (anchors[b, len(chosen):] == 0).all(), "padding goes last, p=0"
    again, _ = sample_anchors(mask, num_anchors, torch.Generator().manual_seed(seed))
    assert torch.equal(anchors, again), "the same seed must give the same anchors"


def test_sampler_avoids_prompt_padding_and_last_position():
    mask = torch.tensor([[0] * 5 + [1] * 10 + [0] * 5])  # prompt 0..4, response 5..14, padding 15..19
    anchors, keep = sample_anchors(mask, 20, torch.Generator().manual_seed(0))
    assert anchors[keep].tolist() == list(range(5, 14)), "C is 5..13: never prompt, padding or the last token"


def test_anchors_differ_across_steps_and_ignore_batch_layout():
    examples = [Example(str(i), list(range(3, 3 + n)), [0] * 4 + [1] * (n - 4)) for i, n in enumerate((40, 25, 60))]
    common = dict(seed=7, num_anchors=8, block_size=8, gamma=4.0, max_seq_len=64, device=torch.device("cpu"),
                  dummy_index=0)
    together = make_micro_batch(examples, [0, 1, 2], step=3, **common)
    alone = make_micro_batch(examples, [1], step=3, **common)
    assert torch.equal(together.anchors[1], alone.anchors[0]), "anchors must not depend on batch-mates or padding"
    later = make_micro_batch(examples, [1], step=4, **common)
    assert not torch.equal(later.anchors, alone.anchors), "each step must draw new anchors"
    other_seed = make_micro_batch(examples, [1], step=3, **{**common, "seed": 8})
    assert not torch.equal(other_seed.anchors, alone.anchors)
    dummy = make_micro_batch(examples, None, step=3, **common)
    assert dummy.weight == 0 and not dummy.keep.any(), "a dummy micro-batch has no anchors and no weight"
    g1, g2 = seeded_generator(1, 2, 3), seeded_generator(1, 2, 3)
    assert torch.equal(torch.rand(4, generator=g1), torch.rand(4, generator=g2))


@pytest.mark.parametrize(("N", "n", "ids"), [
    (30, 1, (15,)), (30, 2, (1, 27)), (30, 3, (1, 14, 27)), (30, 5, (1, 8, 14, 20, 27)),
    (36, 5, (1, 9, 17, 25, 33)), (28, 5, (1, 7, 13, 19, 25)), (32, 5, (1, 8, 15, 22, 29)),
])
def test_layer_id_examples(N, n, ids):
    assert default_target_layer_ids(N, n) == ids


def test_out_of_range_layer_ids_refused():
    target = tiny_target("llama", layers=4)
    with pytest.raises(ConfigError, match="target_layer_ids"):
        DraftConfig.for_target(target.config, 2, 8, mask_token_id=VOCAB - 1, target_layer_ids=(1, 4))


def test_decay():
    assert [gamma_for_block_size(k) for k in (16, 10, 8)] == [7.0, 5.0, 4.0]
    w = decay_weights(16, 7.0)
    assert w[0] == 0.0
    for k in range(1, 16):
        assert math.isclose(w[k].item(), math.exp(-(k - 1) / 7.0), rel_tol=1e-6)
    assert math.isclose(w[15].item(), math.exp(-2.0), rel_tol=1e-6) and abs(w[15].item() - 0.1353) < 1e-4


def test_block_tau_and_pooled_accuracy():
    hits = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    assert block_tau(hits).tolist() == [3.0, 1.0, 5.0], "tau counts the anchor plus the accepted prefix"
    # Two blocks of K=5 (slot 0 included): the second is cut short by the end of the supervised span.
    weights = torch.tensor([[[0, 1, 0.8, 0.6, 0.4], [0, 1, 0.8, 0, 0]]])
    hits = torch.tensor([[[False, True, True, False, True], [False, False, True, False, False]]])
    metrics = BlockMetrics.zeros(5, "cpu")
    metrics.add(torch.tensor(2.0), hits, weights)
    summary = metrics.summary()
    assert summary["acc"] == [0.5, 1.0, 0.0, 1.0], "acc_k = hits / supervised blocks at slot k"
    assert summary["tf_tau"] == 3.0, "only the full block counts toward teacher-forced tau"
    assert math.isclose(summary["loss"], 2.0 / 4.6, rel_tol=1e-4)
