"""The Python API: load a target and a draft, generate from text or token ids, get tokens and statistics.

    from blockdraft import load_target, load_draft, generate
    target = load_target()                      # the embedded SmolLM2-135M-Instruct
    draft = load_draft(target=target)           # the draft shipped for it
    out = generate(target, draft, "Write a haiku about the sea.", max_new_tokens=64)
    print(out.text, out.stats.mean_tau)

    from blockdraft.sampling import SamplingParams
    outs = generate(target, draft, ["Name a color.", "Count to five."],           # one batch, mixed lengths
                    sampling=SamplingParams(temperature=0.7, top_p=0.9, seed=0))  # prompt i uses seed 0 + i
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral

import torch

from .decode.decoder import Decoder
from .decode.generate import GenerationResult
from .decode.options import DecodeOptions, resolve
from .errors import InputError
from .io.drafts import LoadedDraft, load_draft
from .metrics import AcceptanceStats
from .model.draft import DFlashDraftModel
from .model.target import Target
from .sampling import SamplingParams

__all__ = ["Completion", "LoadedDraft", "encode", "generate", "load_draft"]
from .io.prompts import encode_prompt

@dataclass
class Completion:
    text: str
    tokens: list[int]
    finish_reason: str
    stats: AcceptanceStats


def encode(target: Target, prompt, chat: bool = True) -> list[int]:
    """Token ids of one prompt: text, chat messages ({"role", "content"} dicts) or token ids.

    Text goes through the chat template (plain tokenisation with chat=False or a tokenizer without a template);
    messages always need the template; ids pass through unchanged.
    """
    if isinstance(prompt, str):
        if not prompt.strip():
            raise InputError("the prompt is empty; give some text to continue")
        if chat and getattr(target.tokenizer, "chat_template", None):
            return encode_prompt(target.tokenizer, [{"role": "user", "content": prompt}])
        return list(target.tokenizer(prompt)["input_ids"])
    if _is_messages(prompt):
        # Flattening a conversation without the template would silently drop the role markers.
        if not chat or not getattr(target.tokenizer, "chat_template", None):
            raise InputError("a conversation (chat messages) needs the tokenizer's chat template, which is "
                             f"{'switched off' if not chat else 'missing'}; pass plain text or token ids instead")
        return encode_prompt(target.tokenizer, prompt)
    if isinstance(prompt, dict):
        raise InputError("a single chat message is a conversation of one: wrap it in a list, "
                         "[{'role': 'user', 'content': ...}]")
    prompt = _plain(prompt)
    if not _is_ids(prompt):
        raise InputError(f"a prompt must be text, chat messages or a list of token ids, got {type(prompt).__name__} "
                         f"{str(prompt)[:60]!r}")
    return [int(t) for t in prompt]  # ids themselves are checked against the vocabulary before decoding


def generate(target: Target, draft: LoadedDraft | DFlashDraftModel | None, prompt_or_prompts, *,
             max_new_tokens: int = 256, chat: bool = True, stop_token_ids=None, options: DecodeOptions | None = None,
             sampling: SamplingParams | None = None, block_size: int | None = None, tree: bool | None = None,
             adaptive: bool | None = None, lookup: bool | None = None, sampler: str | None = None,
             draft_argmax: bool | None = None):
    """Generate for one prompt -> Completion, or for a list of prompts -> list[Completion], decoded as one batch.

    A prompt is text, chat messages or token ids (see `encode`); prompts of different lengths batch together.
    How to decode is one `DecodeOptions` (decode/options.py): `options`, else the defaults, which are the CLI's
    and the server's (adaptive token trees with prompt-lookup runs grafted on, the draft's block size), with any
    of its fields given here by name on top. Every choice keeps the output exact; only speed differs, and the
    same request gives the same tokens every time (docs/design.md §14).

    `sampling` None or temperature 0 is greedy. At temperature > 0 the output is distributed exactly as the
    target's own sampling. Prompt i draws from its own seed, `sampling.seed + i`, so a seeded call is
    reproducible and prompt i gives the same tokens alone with seed `seed + i` as in the batch (up to float
    rounding between batch shapes). `sampler` "auto" samples coupled when seeded (sampling/gumbel.py: the
    output is then the target-alone sample of the seed, token for token up to float rounding, with or without
    a draft and at any widths) and by rejection otherwise; "coupled" or "rejection" forces one.
    `draft_argmax` proposes the draft's argmax instead of sampling it (rejection sampling only; still exact).
    `stop_token_ids` None stops at the target's end-of-sequence ids.
    """
    if sampling is not None and not isinstance(sampling, SamplingParams):
        raise InputError(f"`sampling` must be a SamplingParams or None, got {type(sampling).__name__}; "
                         "pass SamplingParams(temperature=..., top_p=..., seed=...)")
    options = resolve(options, sampling=sampling, block_size=block_size, tree=tree, adaptive=adaptive,
                      lookup=lookup, sampler=sampler, draft_argmax=draft_argmax)
    prompt_or_prompts = _plain(prompt_or_prompts)  # a tensor or array of ids: 1-D one prompt, 2-D a batch
    if prompt_or_prompts is None or isinstance(prompt_or_prompts, (dict, int, float)):
        raise InputError(f"`prompt_or_prompts` must be text, chat messages, token ids or a list of those, got "
                         f"{prompt_or_prompts!r}" + ("; wrap a single message in a list"
                                                     if isinstance(prompt_or_prompts, dict) else ""))
    single = isinstance(prompt_or_prompts, str) or _is_messages(prompt_or_prompts) or _is_ids(prompt_or_prompts)
    prompts = [prompt_or_prompts] if single else list(prompt_or_prompts)
    ids = [encode(target, p, chat) for p in prompts]
    results = Decoder(target, draft, options).generate(ids, max_new_tokens=max_new_tokens,
                                                       stop_token_ids=stop_token_ids)
    done = [_completion(target, r) for r in results]
    return done[0] if single else done


def _plain(prompt):
    """A tensor or NumPy array of ids as (nested) Python lists; anything else as it is."""
    if isinstance(prompt, torch.Tensor) or type(prompt).__module__ == "numpy":
        return prompt.tolist()
    return prompt


def _is_ids(prompt) -> bool:
    """A non-empty list of whole numbers (Python or NumPy integers; bools and floats are not ids)."""
    return (isinstance(prompt, (list, tuple)) and len(prompt) > 0
            and all(isinstance(t, Integral) and not isinstance(t, bool) for t in prompt))


def _is_messages(prompt) -> bool:
    return isinstance(prompt, (list, tuple)) and len(prompt) > 0 and isinstance(prompt[0], dict)


def _completion(target: Target, result: GenerationResult) -> Completion:
    text = target.tokenizer.decode(result.tokens, skip_special_tokens=True) if target.tokenizer else ""
    return Completion(text, result.tokens, result.finish_reason, result.stats)
