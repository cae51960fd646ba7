"""The training forward's feature standardization (blockdraft/train/forward.py)."""

import torch

from tiny_models import tiny_draft, tiny_target


def test_feature_scale_skips_the_sink_and_floors_quiet_dimensions():
    from blockdraft.train.forward import feature_scale

    rows = torch.ones(5, 4)
    rows[:, 1] = 3.0
    rows[:, 3] = 1e-6
    rows[0] = 1e4  # the attention sink
    scale = feature_scale([rows, rows[:1]])  # a one-token sequence has nothing but its sink
    torch.testing.assert_close(scale, torch.tensor([1.0, 3.0, 1.0, 1e-2]))


def test_standardized_features_keep_the_function_and_export_raw_weights():
    from blockdraft.train.forward import BlockForward
    from blockdraft.train.objective import sample_anchors

    target = tiny_target("llama")
    draft = tiny_draft(target, layers=2, block_size=8)
    forward = BlockForward(draft, target)
    tokens = torch.randint(3, 90, (2, 30), generator=torch.Generator().manual_seed(0))
    features = target.forward(tokens, torch.arange(30).expand(2, 30), target.new_cache(2, 30), (1, 4)).features
    anchors, keep = sample_anchors(torch.ones(2, 30), 5, torch.Generator().manual_seed(1))
    raw_fc = draft.fc.weight.detach().clone()
    before = forward(tokens, anchors, keep, features)
    scale = torch.rand(features.shape[-1], generator=torch.Generator().manual_seed(2)) * 100 + 0.01
    forward.standardize(scale, convert_weights=True)
    after = forward(tokens, anchors, keep, features)
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(draft.fc.weight, raw_fc), "training must see fc' = fc diag(s)"
    torch.testing.assert_close(forward.export_state()["fc.weight"], raw_fc, rtol=1e-6, atol=1e-7)
