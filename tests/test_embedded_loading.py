"""io/targets.load_embedded_model: the embedded target read a tensor at a time is the model from_pretrained reads."""

from __future__ import annotations

import pytest
import torch

from tiny_models import needs_smollm2

pytestmark = needs_smollm2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tensor_at_a_time_is_from_pretrained_bit_for_bit(dtype):
    from transformers import AutoModelForCausalLM

    from blockdraft.io.targets import embedded_target_folder, load_embedded_model

    folder = embedded_target_folder()
    ours = load_embedded_model(folder, dtype)
    theirs = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
    ours_tensors = dict([*ours.named_parameters(), *ours.named_buffers()])
    theirs_tensors = dict([*theirs.named_parameters(), *theirs.named_buffers()])
    assert ours_tensors.keys() == theirs_tensors.keys()
    for name, tensor in theirs_tensors.items():
        assert torch.equal(ours_tensors[name], tensor), f"{name} differs from from_pretrained's"
    assert ours.lm_head.weight is ours.model.embed_tokens.weight, "the head must stay tied to the embedding"
    ids = torch.tensor([[1, 504, 3458, 314]])
    assert torch.equal(ours(ids).logits, theirs(ids).logits)


def test_int4_target_leaves_nothing_on_the_meta_device():
    from blockdraft.io.targets import load_target

    target = load_target(weights="q4")
    left = [n for n, t in [*target.model.named_parameters(), *target.model.named_buffers()] if t.is_meta]
    assert not left, f"{left[:4]} were never read: a forward would fail on them"
    ids = torch.tensor([[1, 504, 3458, 314]])
    assert target.model(ids).logits.shape == (1, 4, 49152), "the Hugging Face model must still run (hf-generate)"


def test_a_copy_that_does_not_fill_the_model_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    from blockdraft.errors import CheckpointError
    from blockdraft.io.targets import embedded_target_folder, load_embedded_model

    folder = embedded_target_folder()
    for item in folder.iterdir():
        if item.name != "model.safetensors":
            (tmp_path / item.name).write_bytes(item.read_bytes())
    tensors = load_file(str(folder / "model.safetensors"))
    tensors.pop("model.norm.weight")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="model.norm.weight"):
        load_embedded_model(tmp_path, torch.float32)
