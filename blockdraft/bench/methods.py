"""The decoders a benchmark compares, behind one call: `method.decode(prompts, max_new_tokens)`.

- `ours-baseline`: the target alone through our decode loop (draft None, same code path as speculative).
- `hf-generate`: transformers' greedy `generate` on the same target weights.
- `hf-prompt-lookup`: transformers' prompt-lookup decoding (`prompt_lookup_num_tokens=10`); batch 1 only.
- `blockdraft`: our DFlash speculative decoding, every step verifying the full block (the reference algorithm).
- `blockdraft-tree`: every step verifying a token tree of K nodes (decode/tree.py): the same verify width, spent
  on the draft's likeliest alternatives instead of one guess per slot.
- `blockdraft-adaptive`: token trees of adaptive width (policy.py: 1 to 2K nodes, down to plain steps when
  drafts miss), priced by the step costs measured once (costs.py).
- `blockdraft-lookup`: adaptive trees with each row's prompt-lookup continuation grafted on as one more path
  when it pays (decode/lookup.py): the default mode.
- `blockdraft-lookup-only`: the default mode with the draft never run (`DecodeOptions.drafting=False`): its
  prompt-lookup and n-gram runs verified on plain steps. Beside the default mode it says what the draft adds.
- `dflash-reference`: the reference runtime `dflash==0.1.0` (`dflash.model.dflash_generate`), only when it is
  importable and the draft is a checkpoint folder; never a dependency.
- `llama-cpp`: llama.cpp (`llama-cpp-python`) greedy on the target's GGUF file at its own precision, fed our
  prompt token ids, on as many threads as torch; only when it is importable and the target is a GGUF (the
  embedded one); never a dependency.
- `llama-cpp-server`: llama.cpp's server binary alone on the same GGUF (bench/llama_server.py): the plain decode
  its DFlash is checked against (it may round otherwise than `llama-cpp`: other default kernels).
- `llama-cpp-dflash`: llama.cpp's own DFlash speculative decoding (`llama-server --spec-type draft-dflash`) on
  the same GGUF target with our draft exported to its GGUF (io/gguf_draft.py), one method per draft length asked
  (`llama-cpp-dflash-n3` ...); both only where the binary is found.

Every method decodes greedily, or with `sampling` samples with the same parameters (each call of ours from its
own seeds, `Sampled`, by rejection or coupled; HF's from its global generator, seeded per call), with the same
stop tokens, and returns
the raw new tokens; the runner truncates them all by one rule. Methods that cannot batch decode their prompts
one at a time inside `decode`. The names and `Decoded` live in decoded.py, the other runtimes' methods in
external.py; every name is importable from here.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from ..decode.decoder import Decoder
from ..decode.options import PRESETS, DecodeOptions
from ..errors import InputError
from ..model.draft import DFlashDraftModel
from ..model.target import Target
from ..sampling import SamplingParams
from .decoded import (ADAPTIVE, BASELINE, HF_GENERATE, LLAMA_CPP, LLAMA_DFLASH, LLAMA_SERVER, LOOKUP, LOOKUP_ONLY,
                      METHODS, OURS, PROMPT_LOOKUP, PROMPT_LOOKUP_NUM_TOKENS, REFERENCE, REQUIRED, SPECULATIVE, TREE,
                      Decoded)
from .external import (LlamaCppMethod, ReferenceMethod, ServerMethod, llama_cpp_method, reference_method,
                       server_methods)

__all__ = ["ADAPTIVE", "BASELINE", "HF_GENERATE", "LLAMA_CPP", "LLAMA_DFLASH", "LLAMA_SERVER", "LOOKUP", "LOOKUP_ONLY",
           "METHODS",
           "OURS", "PROMPT_LOOKUP", "REFERENCE", "REQUIRED", "SPECULATIVE", "TREE", "Decoded", "HFMethod",
           "LlamaCppMethod", "OursMethod", "ReferenceMethod", "Sampled", "ServerMethod", "build_methods",
           "choose_methods", "llama_cpp_method", "reference_method", "server_methods"]


class Sampled:
    """Seeds for the sampled calls of one method: call c of a run starts at seed + c * 2**20 (prompt i of a call
    adds i), so every call draws fresh numbers and a whole bench is reproducible from `sampling.seed`."""

    def __init__(self, sampling: SamplingParams | None) -> None:
        self.sampling = None if sampling is None or sampling.greedy else sampling
        self.calls = 0

    def next_seed(self) -> int | None:
        if self.sampling is None:
            return None
        self.calls += 1
        return ((self.sampling.seed or 0) + self.calls * 2**20) % 2**63


class OursMethod:
    """Our decoder with `options` (a preset, decode/options.py); `draft=None` is the target-only baseline. Every
    call decodes with fresh width policies, as a server request does: a prompt's widths follow its own
    acceptance and the cost model measured once, not what earlier prompts did."""

    def __init__(self, name: str, target: Target, draft, options: DecodeOptions, stop_token_ids: list[int],
                 sampling: SamplingParams | None = None, measure_costs: bool = False) -> None:
        self.name = name
        self.seeds = Sampled(sampling)
        self.decoder = Decoder(target, draft, options, measure_costs=measure_costs)
        self.stop_token_ids = stop_token_ids

    def decode(self, prompts: list[list[int]], max_new_tokens: int) -> list[Decoded]:
        seed = self.seeds.next_seed()  # call c of every method is seeded alike: coupled samples are then the same
        options = self.decoder.options
        if seed is not None:
            options = replace(options, sampling=replace(self.seeds.sampling, seed=seed))
        results = self.decoder.generate(prompts, max_new_tokens=max_new_tokens, options=options,
                                        stop_token_ids=self.stop_token_ids)
        return [Decoded(r.tokens, r.stats if self.decoder.speculative else None) for r in results]


class HFMethod:
    """transformers `generate`, greedy or sampling, on the target's own HF model (left-padded when batched)."""

    def __init__(self, name: str, target: Target, stop_token_ids: list[int], prompt_lookup: int | None = None,
                 sampling: SamplingParams | None = None):
        self.name, self.target, self.stop_token_ids = name, target, stop_token_ids
        self.prompt_lookup = prompt_lookup
        self.seeds = Sampled(sampling)
        self.pad_token_id = _pad_token_id(target, stop_token_ids)

    def decode(self, prompts: list[list[int]], max_new_tokens: int) -> list[Decoded]:
        if self.prompt_lookup is not None:  # transformers' prompt lookup refuses batches larger than 1
            return [self._generate([p], max_new_tokens)[0] for p in prompts]
        return self._generate(prompts, max_new_tokens)

    def _generate(self, prompts: list[list[int]], max_new_tokens: int) -> list[Decoded]:
        from transformers import GenerationConfig

        width = max(len(p) for p in prompts)
        device = self.target.device
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long, device=device)  # [B, T]
        mask = torch.zeros_like(ids)
        for b, p in enumerate(prompts):  # left padding: every row's next token sits at column `width`
            ids[b, width - len(p):] = torch.tensor(p, device=device)
            mask[b, width - len(p):] = 1
        # A config built here, not the model's, so a sampling default in the checkpoint cannot leak in (HF's own
        # top_k of 50 included: 0 switches a filter off, as in ours).
        sampling = self.seeds.sampling
        filters = {} if sampling is None else dict(temperature=sampling.temperature, top_k=sampling.top_k,
                                                   top_p=sampling.top_p, min_p=sampling.min_p or None)
        config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=sampling is not None, num_beams=1,
                                  eos_token_id=list(self.stop_token_ids) or None, pad_token_id=self.pad_token_id,
                                  prompt_lookup_num_tokens=self.prompt_lookup, **filters)
        seed = self.seeds.next_seed()
        if seed is not None:
            torch.manual_seed(seed)  # HF samples from the global generator
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # generation-config chatter would bury the table
            out = self.target.model.generate(ids, attention_mask=mask, generation_config=config)
        return [Decoded(row[width:].tolist()) for row in out]


def choose_methods(names: str | Sequence[str] | None) -> tuple[str, ...]:
    """The methods to run, in their base order, from a comma-separated list (None: all of them); the two
    references are always kept. An unknown name is refused with the known ones."""
    if names is None:
        return METHODS
    wanted = [n.strip() for n in names.split(",")] if isinstance(names, str) else [str(n).strip() for n in names]
    wanted = [n for n in wanted if n]
    unknown = [n for n in wanted if n not in METHODS]
    if unknown or not wanted:
        what = f"unknown method {unknown[0]!r}" if unknown else "no method named"
        raise InputError(f"{what}; pass a comma-separated list of: {', '.join(METHODS)} "
                         f"({' and '.join(REQUIRED)} always run: every speedup and exactness check refers to them)")
    return tuple(n for n in METHODS if n in wanted or n in REQUIRED)


def build_methods(target: Target, draft: DFlashDraftModel, block_size: int, stop_token_ids: list[int],
                  draft_folder: str | Path | None = None,
                  names: Sequence[str] = METHODS, sampling: SamplingParams | None = None,
                  coupled: bool = False, gguf: str | Path | None = None,
                  llama_draft_max: Sequence[int] = (2,), measure_costs: bool = False) -> tuple[list, list[str]]:
    """The methods named (all by default) that can run here, in their base order, and a note for each one
    skipped. With `sampling` (temperature > 0) every method samples, ours coupled when `coupled`; the reference
    runtime and llama.cpp are then left out. `gguf`: the target's GGUF file, for llama.cpp; `llama_draft_max`:
    the draft lengths llama.cpp's DFlash runs at, one method each. `measure_costs`: ours time their step costs
    afresh (once per process, in the warm-up) instead of reading the cache."""
    s = dict(sampling=sampling)
    sampler = "coupled" if coupled else "rejection"

    def ours(name: str, preset: str | None):
        options = replace(PRESETS[preset or "chain"], block_size=block_size, sampler=sampler)
        return OursMethod(name, target, draft if preset else None, options, stop_token_ids, sampling, measure_costs)

    methods = [
        ours(BASELINE, None),
        HFMethod(HF_GENERATE, target, stop_token_ids, **s),
        HFMethod(PROMPT_LOOKUP, target, stop_token_ids, prompt_lookup=PROMPT_LOOKUP_NUM_TOKENS, **s),
        ours(SPECULATIVE, "chain"),
        ours(TREE, "tree"),
        ours(ADAPTIVE, "adaptive"),
        ours(LOOKUP, "default"),
        ours(LOOKUP_ONLY, "lookup-only"),
    ]
    methods = [m for m in methods if m.name in names]
    notes = []
    for name in (REFERENCE, LLAMA_CPP, LLAMA_SERVER, LLAMA_DFLASH):
        if name not in names:
            continue
        if sampling is not None and not sampling.greedy:
            found, note = [], f"{name} skipped: it is benchmarked greedy only"
        elif name == REFERENCE:
            found, note = _listed(reference_method(target, block_size, stop_token_ids, draft_folder))
        elif name == LLAMA_CPP:
            found, note = _listed(llama_cpp_method(gguf, stop_token_ids))
        else:
            found, note = server_methods(name, draft, gguf, draft_folder,
                                         llama_draft_max if name == LLAMA_DFLASH else (None,))
        methods += found
        if note:
            notes.append(note)
    return methods, notes


def _listed(built: tuple) -> tuple[list, str | None]:
    method, note = built
    return ([] if method is None else [method]), note


def _pad_token_id(target: Target, stop_token_ids: list[int]) -> int:
    """A pad id for left padding (masked out, so any valid id works); the model's own one when it has one."""
    for source in (target.model.generation_config, target.config, target.tokenizer):
        pad = getattr(source, "pad_token_id", None) if source is not None else None
        if isinstance(pad, int):
            return pad
    return stop_token_ids[0] if stop_token_ids else 0
