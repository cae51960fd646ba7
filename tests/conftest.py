"""Shared fixtures: tiny random Llama and Qwen3 targets, drafts over them, and a scripted fake drafter."""

from __future__ import annotations

import pytest
import torch

from blockdraft.decode.costs import linear_costs

from blockdraft.model.target import Target

# Tiny models are dominated by thread hand-offs: one thread is many times faster, above all on shared cores.
torch.set_num_threads(1)

VOCAB = 96


# A fixed step-cost model (decode/costs.py) for tests that build adaptive policies and lookups themselves: a plain
# step costs 1, the draft a third of one more, each verified position 2 % of one.
COSTS = linear_costs(plain=1.0, draft=1 / 3, per_position=0.02)


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


def random_prompts(lengths: list[int], seed: int) -> list[list[int]]:
    """Prompts of the given lengths over the printable ids 3..89, drawn from `seed`."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 90, (n,), generator=generator).tolist() for n in lengths]


@pytest.fixture(params=["llama", "qwen3"])
def target(request) -> Target:
    return tiny_target(request.param)


class ScriptedDrafter:
    """A fake draft whose proposals are right for exactly the first j slots of each step.

    It knows the target's own greedy continuation of each row (`reference[row]`, prompt included) and
    cycles j through 0..K-1, so every acceptance length 1..K occurs. Wrong slots propose the correct token
    plus one (mod V), which the target never agrees with.
    """

    def __init__(self, reference: list[list[int]], block_size: int) -> None:
        self.reference = reference
        self.block_size = block_size
        self.trained_block_size = block_size
        self.tap_layer_ids = ()
        self.calls = 0
        self.rows = torch.arange(len(reference))

    def start(self, batch: int, capacity: int, prompts=None) -> None:
        self.rows = torch.arange(batch)

    def keep_rows(self, rows: torch.Tensor) -> None:
        self.rows = self.rows[rows]

    def append_context(self, features, counts) -> None:
        pass

    def propose_top(self, anchors: torch.Tensor, anchor_positions: torch.Tensor, slots: int, top_k: int,
                    score=None):
        """A token tree's candidates, from `propose` (as the real Drafter's, normalised over what it scores)."""
        from blockdraft.decode.tree import top_candidates

        logits = self.propose(anchors, anchor_positions, slots)
        scores = logits.log_softmax(-1) if score is None else score(logits, None, logits.shape[-1])
        return top_candidates(scores, top_k)

    def propose(self, anchors: torch.Tensor, anchor_positions: torch.Tensor, slots: int | None = None) -> torch.Tensor:
        K = self.block_size
        right = self.calls % K
        self.calls += 1
        logits = torch.zeros(anchors.shape[0], K - 1, VOCAB)
        for b, (row, s) in enumerate(zip(self.rows.tolist(), anchor_positions.tolist())):
            ref = self.reference[row]
            for k in range(1, K):
                truth = ref[s + k] if s + k < len(ref) else 0
                token = truth if k <= right else (truth + 1) % VOCAB
                logits[b, k - 1, token] = 10.0
        return logits[:, :slots]


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
