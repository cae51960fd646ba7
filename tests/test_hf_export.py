"""`blockdraft export --to transformers` and reading such folders back (blockdraft/io/hf_export.py).

The export must load in transformers' own DFlash class with no missing or unexpected keys, decode there
exactly as the target alone and as blockdraft do, read back as the same draft, and keep every config key
vLLM's and SGLang's DFlash loaders read.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from blockdraft.io.drafts import DEFAULT_DRAFT
from blockdraft.cli import main
from blockdraft.io.checkpoint import read_checkpoint, read_config, write_checkpoint
from tiny_models import needs_smollm2, tiny_draft, tiny_target

PROMPTS = [
    "Write a haiku about autumn leaves.",
    "Explain in three sentences why the sky is blue.",
    "What are the main differences between a list and a tuple in Python?",
]
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The shipped draft exported with the command's defaults (DRAFT omitted)."""
    out = tmp_path_factory.mktemp("export") / "smollm2-dflash"
    assert main(["export", str(out), "--to", "transformers"]) == 0
    return out


def load_in_transformers(folder, dtype=torch.float32):
    from transformers import MuseGlimmerAssistantModel

    model, info = MuseGlimmerAssistantModel.from_pretrained(folder, output_loading_info=True, dtype=dtype)
    return model.eval(), info


# ---------------------------------------------------------------------------------------------------------
# The export and reading it back


def test_export_loads_in_transformers_without_missing_or_unexpected_keys(exported):
    model, info = load_in_transformers(exported)
    assert info["missing_keys"] == set(), "a missing tensor would run with random weights in transformers"
    assert info["unexpected_keys"] == set(), "an unexpected tensor is dropped silently by transformers"
    assert info["mismatched_keys"] == set() and not info["error_msgs"]
    cfg = read_config(DEFAULT_DRAFT)
    hf = model.config
    assert (hf.block_size, hf.mask_token_id, list(hf.target_layer_ids)) == (
        cfg.block_size, cfg.mask_token_id, list(cfg.target_layer_ids)), "the DFlash interface must carry over"
    assert hf.rope_parameters["rope_theta"] == cfg.rope_theta, "transformers defaults theta to 500000"
    assert hf.layer_types == ["full_attention"] * cfg.num_hidden_layers, "transformers defaults to sliding layers"


def test_export_weights_are_the_drafts_under_transformers_names(exported):
    model, _ = load_in_transformers(exported, dtype=torch.bfloat16)
    _, tensors = read_checkpoint(DEFAULT_DRAFT)
    theirs = model.state_dict()
    assert torch.equal(theirs["encoder.fc.weight"], tensors["fc.weight"])
    assert torch.equal(theirs["encoder.output_norm_enc.weight"], tensors["hidden_norm.weight"])
    assert torch.equal(theirs["layers.1.self_attn.k_norm.weight"], tensors["layers.1.self_attn.k_norm.weight"])


def test_export_then_read_gives_identical_tensors_and_equal_config(exported):
    cfg, tensors = read_checkpoint(DEFAULT_DRAFT)
    back_cfg, back = read_checkpoint(exported)
    assert back_cfg == cfg, "a round trip must not change any field (ids, mask, RoPE, provenance)"
    assert back.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), f"{name} changed"


def test_load_draft_reads_a_transformers_folder(exported):
    from blockdraft import load_draft

    draft = load_draft(exported)
    assert draft.config == read_config(DEFAULT_DRAFT)


def test_foreign_transformers_folder_without_our_keys_is_refused_by_name(exported, tmp_path):
    # A draft saved by transformers itself lacks num_target_layers and vocab_size; guessing them is refused.
    folder = tmp_path / "foreign"
    shutil.copytree(exported, folder)
    data = json.loads((folder / "config.json").read_text())
    for key in ("num_target_layers", "vocab_size", "dflash_config", "blockdraft"):
        del data[key]
    (folder / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="`num_target_layers` is required.*\n.*`vocab_size` is required"):
        read_checkpoint(folder)
    data.update(num_target_layers=30, vocab_size=49152)
    (folder / "config.json").write_text(json.dumps(data))
    assert read_config(folder).target_layer_ids == read_config(DEFAULT_DRAFT).target_layer_ids


def test_export_refuses_a_folder_that_is_not_empty(exported, capsys):
    assert main(["export", str(DEFAULT_DRAFT), str(exported)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "exists and is not empty" in err and "empty folder" in err


def test_export_refuses_a_folder_that_is_not_a_draft(tmp_path, capsys):
    (tmp_path / "notes").mkdir()
    assert main(["export", str(tmp_path / "notes"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "config.json is missing" in err and "draft folder" in err
    assert not (tmp_path / "out").exists(), "nothing is written for a refused export"


def test_export_refuses_a_draft_transformers_would_run_differently(tmp_path, capsys):
    # transformers' class has no attention biases: the bias tensors would be dropped as unexpected.
    import dataclasses

    target = tiny_target("qwen3")
    draft = tiny_draft(target)
    cfg = dataclasses.replace(draft.config, attention_bias=True)
    state = dict(draft.state_dict())
    for i in range(cfg.num_hidden_layers):
        for proj, size in (("q", 64), ("k", 32), ("v", 32), ("o", 64)):
            state[f"layers.{i}.self_attn.{proj}_proj.bias"] = torch.zeros(size)
    write_checkpoint(tmp_path / "draft", cfg, state)
    assert main(["export", str(tmp_path / "draft"), str(tmp_path / "out")]) == 2
    assert "`attention_bias` is true" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------
# transformers' own speculative generate with the export


@pytest.fixture(scope="module")
def smollm2():
    from blockdraft import load_draft, load_target

    target = load_target(dtype="float32")
    # full_vocab: transformers proposes from the whole vocabulary, so blockdraft must too for equal acceptance.
    return target, load_draft(target=target, full_vocab=True)


def transformers_generate(target, assistant, ids: list[int], monkeypatch) -> tuple[list[int], list[int]]:
    """(new tokens, accepted proposals per verify step) of transformers' DFlash generate, greedy.

    transformers exposes no acceptance counts, but its loop hands each step's accepted count (`n_matches`,
    already cut to max_new_tokens) to `candidate_generator.update_candidate_strategy` once per target
    forward; the DFlash generator ignores the call, so recording it changes nothing. The first call is the
    prefill, which proposes nothing.
    """
    from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator

    accepted: list[int] = []
    monkeypatch.setattr(DFlashTokenCandidateGenerator, "update_candidate_strategy",
                        lambda self, input_ids, scores, num_matches: accepted.append(int(num_matches)))
    out = target.model.generate(torch.tensor([ids]), assistant_model=assistant, speculation_type="dflash",
                                max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, len(ids):].tolist(), accepted[1:]


def blockdraft_generate(target, draft, ids: list[int], monkeypatch):
    """blockdraft's completion and each verify step's tau in order (AcceptanceStats keeps only histograms)."""
    import blockdraft
    from blockdraft.metrics import AcceptanceStats

    taus: list[int] = []
    record = AcceptanceStats.record

    def logged(self, tau, *args, **kwargs):
        taus.append(tau)
        record(self, tau, *args, **kwargs)

    monkeypatch.setattr(AcceptanceStats, "record", logged)
    out = blockdraft.generate(target, draft, ids, max_new_tokens=NEW_TOKENS, adaptive=False, lookup=False,
                              tree=False)
    return out, taus


@needs_smollm2
@pytest.mark.parametrize("prompt", PROMPTS)
def test_transformers_dflash_generate_equals_target_and_blockdraft(prompt, smollm2, exported, monkeypatch):
    from blockdraft.api import encode

    target, draft = smollm2
    assistant, _ = load_in_transformers(exported)
    ids = encode(target, prompt)
    greedy = target.model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
    greedy = greedy[0, len(ids):].tolist()
    theirs, accepted = transformers_generate(target, assistant, ids, monkeypatch)
    ours, taus = blockdraft_generate(target, draft, ids, monkeypatch)
    assert theirs == greedy, "transformers' speculative output must be the target's own greedy tokens"
    assert ours.tokens == greedy, "blockdraft's speculative output must be the target's own greedy tokens"
    # Same draft, same chain of K-1 proposals per step: the same verify steps accept the same counts. Our tau
    # counts the bonus (metrics.py), theirs is accepted proposals; both count only the returned tokens of the
    # last step, which the budget cuts.
    assert len(accepted) == len(taus) == ours.stats.steps
    assert [n + 1 for n in accepted] == taus, "per-step acceptance differs from transformers'"
    assert sum(taus) + 1 == ours.stats.tokens + 1 == NEW_TOKENS, "tau counts the returned tokens, the prefill's not"
    assert sum(n + 1 for n in accepted) + 1 == len(theirs) == NEW_TOKENS


# ---------------------------------------------------------------------------------------------------------
# Config keys vLLM's and SGLang's DFlash loaders read, in our native config.json and in the export.
#
# vLLM: vllm-project/vllm, vllm/model_executor/models/qwen3_dflash.py (the layers, attention mode, mask id,
# fc width), vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py (`get_eagle3_aux_layers_from_config`: the
# tapped layers) and vllm/model_executor/models/registry.py (`DFlashDraftModel` -> qwen3_dflash).
# SGLang: sgl-project/sglang, python/sglang/srt/speculative/dflash_utils.py (`parse_dflash_draft_config`,
# `get_dflash_layer_types`, `get_dflash_attention_sliding_window_size`) and python/sglang/srt/models/dflash.py
# (the layers; `EntryClass = [DFlashDraftModel]`).
# Each view below resolves a key the way that loader does (which spelling wins, which default applies).


def _nested(config: dict) -> dict:
    return config.get("dflash_config") or {}


def _theta(config: dict):
    params = config.get("rope_parameters") or {}
    return params.get("rope_theta", config.get("rope_theta"))


def vllm_view(config: dict) -> dict:
    nested = _nested(config)
    # The tapped layers: eagle_aux_hidden_state_layer_ids as given (already +1), else DFlash ids + 1.
    taps = config.get("eagle_aux_hidden_state_layer_ids") or [
        i + 1 for i in (nested.get("target_layer_ids") or config.get("target_layer_ids") or [])]
    return {
        "hidden_size": config.get("hidden_size"),
        "fc_in": (config.get("target_hidden_size") or config.get("hidden_size")) * len(taps),
        "num_hidden_layers": config.get("num_hidden_layers"),
        "num_attention_heads": config.get("num_attention_heads"),
        "num_key_value_heads": config.get("num_key_value_heads"),
        "head_dim": config.get("head_dim"),
        "intermediate_size": config.get("intermediate_size"),
        "hidden_act": config.get("hidden_act"),
        "rms_norm_eps": config.get("rms_norm_eps"),
        "attention_bias": config.get("attention_bias", False),
        "max_position_embeddings": config.get("max_position_embeddings"),
        "vocab_size": config.get("vocab_size"),
        "draft_vocab_size": config.get("draft_vocab_size") or config.get("vocab_size"),
        "rope_theta": _theta(config) or 1e6,  # set_default_rope_theta(config, default_theta=1000000)
        "is_neox_style": config.get("is_neox_style", True),
        "mask_token_id": nested.get("mask_token_id", config.get("mask_token_id")),
        "taps": taps,
        # _dflash_layer_causal: is_causal, else dflash_config.causal, else sliding layers are causal.
        "causal": [config["is_causal"] if config.get("is_causal") is not None else
                   nested["causal"] if nested.get("causal") is not None else
                   t == "sliding_attention" for t in config.get("layer_types") or []],
        # _resolve_layer_attention: use_swa forces a window on every layer.
        "sliding": nested.get("use_swa", False) or "sliding_attention" in (config.get("layer_types") or []),
        "sink_bias": nested.get("attention_sink_bias", config.get("add_swa_attention_sink_bias", False)),
        "use_aux_hidden_state": nested.get("use_aux_hidden_state", config.get("use_aux_hidden_state", True)),
        "logit_scale": config.get("logit_scale", 1.0),
    }


def sglang_view(config: dict) -> dict:
    nested = _nested(config)
    return {
        "num_hidden_layers": config.get("num_hidden_layers"),
        # dflash_config wins, then the top level; ids are checked against num_target_layers.
        "num_target_layers": nested.get("num_target_layers", config.get("num_target_layers")),
        "block_size": nested.get("block_size", config.get("block_size")),
        "target_layer_ids": nested.get("target_layer_ids", config.get("target_layer_ids")),
        # Only dflash_config.mask_token_id; without it SGLang looks up the string mask_token ("<|MASK|>").
        "mask_token_id": nested.get("mask_token_id"),
        "mask_token": nested.get("mask_token"),
        "layer_types": config.get("layer_types"),
        "hidden_size": config.get("hidden_size"),
        "num_attention_heads": config.get("num_attention_heads"),
        "num_key_value_heads": config.get("num_key_value_heads"),
        "head_dim": config.get("head_dim"),
        "intermediate_size": config.get("intermediate_size"),
        "hidden_act": config.get("hidden_act", "silu"),
        "rms_norm_eps": config.get("rms_norm_eps"),
        "attention_bias": config.get("attention_bias", False),
        "max_position_embeddings": config.get("max_position_embeddings", 32768),
        "rope_theta": _theta(config),
        "rope_is_neox_style": config.get("rope_is_neox_style", config.get("is_neox_style", True)),
    }


@pytest.fixture(scope="module", params=["native", "export"])
def written(request, exported, tmp_path_factory):
    """config.json as blockdraft writes it: our format (write_checkpoint) or the transformers export."""
    if request.param == "export":
        return json.loads((exported / "config.json").read_text())
    cfg, tensors = read_checkpoint(DEFAULT_DRAFT)
    folder = tmp_path_factory.mktemp("native")
    write_checkpoint(folder, cfg, tensors)
    return json.loads((folder / "config.json").read_text())


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def test_written_config_carries_every_key_vllm_reads(written):
    cfg = read_config(DEFAULT_DRAFT)
    view = vllm_view(written)
    shape = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
             "intermediate_size", "max_position_embeddings", "vocab_size")
    for key in shape:
        assert _is_int(view[key]) and view[key] == getattr(cfg, key), f"vLLM reads `{key}`"
    assert view["hidden_act"] == "silu" and view["attention_bias"] is False
    assert isinstance(view["rms_norm_eps"], float) and view["rms_norm_eps"] == cfg.rms_norm_eps
    assert view["rope_theta"] == cfg.rope_theta, "vLLM's default base is 1e6: theta must be written"
    assert view["is_neox_style"] is True, "our RoPE is rotate-half (neox)"
    assert view["draft_vocab_size"] == cfg.vocab_size, "a smaller draft vocabulary needs a d2t map we never write"
    assert _is_int(view["mask_token_id"]) and view["mask_token_id"] == cfg.mask_token_id
    # vLLM taps output_hidden_states[j + 1] for id j (docs/format.md §3.1); a written aux list would be used as is.
    assert "eagle_aux_hidden_state_layer_ids" not in written
    assert view["taps"] == [j + 1 for j in cfg.target_layer_ids]
    assert view["fc_in"] == len(cfg.target_layer_ids) * cfg.hidden_size, "fc in-features = n * D"
    assert view["causal"] == [False] * cfg.num_hidden_layers, "DFlash v1 attention is non-causal"
    assert view["sliding"] is False and view["sink_bias"] is False, "no windows and no sink tensors"
    assert view["use_aux_hidden_state"] is True and view["logit_scale"] == 1.0


def test_written_config_carries_every_key_sglang_reads(written):
    cfg = read_config(DEFAULT_DRAFT)
    view = sglang_view(written)
    assert _is_int(view["num_target_layers"]) and view["num_target_layers"] == cfg.num_target_layers, (
        "without it SGLang checks the ids against the draft's own layer count and refuses valid ids")
    assert _is_int(view["block_size"]) and view["block_size"] == cfg.block_size, "SGLang's default is 16"
    ids = view["target_layer_ids"]
    assert isinstance(ids, list) and all(_is_int(i) for i in ids) and ids == list(cfg.target_layer_ids)
    assert max(ids) < view["num_target_layers"]
    assert _is_int(view["mask_token_id"]) and view["mask_token_id"] == cfg.mask_token_id, (
        "SGLang reads the mask id only from dflash_config; else it looks up a <|MASK|> token SmolLM2 lacks")
    assert view["mask_token"] is None
    assert view["layer_types"] == ["full_attention"] * cfg.num_hidden_layers, "full layers are ENCODER_ONLY there"
    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "intermediate_size", "max_position_embeddings"):
        assert _is_int(view[key]) and view[key] == getattr(cfg, key), f"SGLang reads `{key}`"
    assert view["hidden_act"] == "silu" and view["attention_bias"] is False
    assert view["rms_norm_eps"] == cfg.rms_norm_eps and view["rope_theta"] == cfg.rope_theta
    assert view["rope_is_neox_style"] is True


def test_native_architecture_is_the_one_both_engines_register(written):
    # vLLM's registry and SGLang's EntryClass both key on DFlashDraftModel; the export names transformers'
    # class instead, so engines are given the native folder (vLLM also renames encoder.* tensors).
    expected = {"DFlashDraftModel"} if written["model_type"] == "qwen3" else {"MuseGlimmerAssistantModel"}
    assert set(written["architectures"]) == expected
