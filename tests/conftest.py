"""Shared fixtures: tiny targets of each family, saved model folders, the fixed step costs every adaptive decode is
priced with, the in-process server, and exact sampling's small models.

Fixtures here reach every test module without an import. The plain helpers they are built from live in modules of
their own, imported by name: tiny_models (targets, drafts, tokenizer, marks), step_fakes (costs, scripted drafter,
width policies, proposers), train_fakes (data, configs, checkpoints), server_client (requests, a loopback server),
exact_sampling (the statistics). No test module imports from another.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch

from blockdraft.model.target import Target

from server_client import BODY_LIMIT, LIMIT, MODEL, wait_for
from step_fakes import COSTS, QuietWatch
from tiny_models import char_tokenizer, tiny_draft, tiny_target

if TYPE_CHECKING:
    from blockdraft.model.draft import DFlashDraftModel

# Tiny models are dominated by thread hand-offs: one thread is many times faster, above all on shared cores.
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_folders(tmp_path_factory):
    """A tiny target (with the character tokenizer) and a one-layer draft of K=8 saved as folders: (target, draft)
    paths for command-line tests."""
    from blockdraft.io.checkpoint import write_checkpoint

    root = tmp_path_factory.mktemp("models")
    target = tiny_target("llama")
    target.model.save_pretrained(root / "target")
    char_tokenizer().save_pretrained(root / "target")
    draft = tiny_draft(target, layers=1, block_size=8)
    write_checkpoint(root / "draft", draft.config, draft.state_dict(), dtype=draft.fc.weight.dtype)
    return str(root / "target"), str(root / "draft")


@pytest.fixture(autouse=True)
def fixed_step_costs(request, monkeypatch):
    """Adaptive decodes price their steps with COSTS instead of timing the tiny test models: a width measured on a
    busy machine would change which steps a test sees (never the output). Tests marked `measured_costs` time them."""
    if request.node.get_closest_marker("measured_costs") is None:
        import blockdraft.decode.decoder as decoder

        monkeypatch.setattr(decoder, "measured_costs", lambda *args, **kwargs: COSTS)
    else:  # timed for real, always as on a quiet machine: a busy one would measure a cache again mid-test
        import blockdraft.decode.costs as costs
        import blockdraft.decode.measure as measure

        monkeypatch.setattr(costs, "WaitWatch", QuietWatch)
        monkeypatch.setattr(measure, "WaitWatch", QuietWatch)


@pytest.fixture(params=["llama", "qwen3"])
def target(request) -> Target:
    return tiny_target(request.param)


@pytest.fixture(scope="module")
def model():
    """The served (target, draft): a tiny llama target with the character tokenizer, and a K = 8 draft."""
    target = tiny_target("llama")
    target.tokenizer = char_tokenizer()
    return target, tiny_draft(target, block_size=8)


@pytest.fixture(scope="module")
def client(model):
    """An in-process client of the server over `model`, with this group's limits, once it has warmed up."""
    from fastapi.testclient import TestClient

    from blockdraft.server import create_app

    target, draft = model
    app = create_app(target, draft, model_id=MODEL, max_batch=8, max_tokens_limit=LIMIT, max_body_bytes=BODY_LIMIT)
    with TestClient(app) as test_client:
        # With an empty cost cache (a fresh machine) the server warms up first: /health says 503 "warming" meanwhile.
        wait_for(lambda: test_client.get("/health").status_code == 200,
                 describe=lambda: test_client.get("/health").json())
        yield test_client


@pytest.fixture(scope="module")
def small_models() -> tuple[Target, DFlashDraftModel]:
    """A 6-token target with peaked (not uniform) distributions, and a 1-layer draft whose q differs from p."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from blockdraft.config import DraftConfig
    from blockdraft.model.draft import DFlashDraftModel

    from exact_sampling import SMALL_VOCAB

    torch.manual_seed(0)
    hf_config = LlamaConfig(vocab_size=SMALL_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                            tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=0)
    model = LlamaForCausalLM(hf_config)
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)  # random init is near uniform; scaled, the first token's top p is ~0.5
    target = Target(model.float().eval())
    cfg = DraftConfig.for_target(target.config, num_draft_layers=1, block_size=4, mask_token_id=SMALL_VOCAB - 1)
    draft = DFlashDraftModel(cfg)
    draft.init_weights(generator=torch.Generator().manual_seed(1))
    return target, draft.float().eval()
