"""The bench's methods from other runtimes, each built only where it can run here, else skipped with a note
(methods.py lists every method): the reference runtime `dflash==0.1.0`, llama.cpp through `llama-cpp-python`, and
llama.cpp's server alone and with its own DFlash (llama_server.py). None of them is a dependency.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import torch

from ..io.checkpoint import read_checkpoint
from ..io.gguf_draft import write_gguf_draft
from ..metrics import AcceptanceStats
from ..model.target import Target
from .decoded import LLAMA_CPP, LLAMA_DFLASH, REFERENCE, Decoded


class ReferenceMethod:
    """`dflash.model.dflash_generate` of the reference runtime, one prompt at a time (it supports batch 1 only)."""

    def __init__(self, target: Target, reference_draft, dflash_generate, block_size: int,
                 stop_token_ids: list[int]) -> None:
        self.name, self.target, self.draft = REFERENCE, target, reference_draft
        self.dflash_generate, self.block_size, self.stop_token_ids = dflash_generate, block_size, stop_token_ids

    def decode(self, prompts: list[list[int]], max_new_tokens: int) -> list[Decoded]:
        return [self._one(p, max_new_tokens) for p in prompts]

    def _one(self, prompt: list[int], max_new_tokens: int) -> Decoded:
        ids = torch.tensor([prompt], device=self.target.device)  # [1, T]
        # Its stats path calls torch.cuda.synchronize, which fails on a CPU-only build: ask for them on CUDA only.
        with_stats = self.target.device.type == "cuda"
        out = self.dflash_generate(model=self.draft, target=self.target.model, input_ids=ids,
                                   max_new_tokens=max_new_tokens, stop_token_ids=self.stop_token_ids,
                                   temperature=0.0, block_size=self.block_size, return_stats=with_stats)
        output_ids = out.output_ids if with_stats else out
        stats = None
        if with_stats:
            stats = AcceptanceStats(self.block_size)
            for tau in out.acceptance_lengths:
                stats.record(max(1, int(tau)))
        return Decoded(output_ids[0, len(prompt):].tolist(), stats)


class LlamaCppMethod:
    """llama.cpp's greedy decode of `gguf` (its own quantized weights), one prompt at a time on `threads` threads.

    Our token ids go in as they are (no BOS added, no re-tokenising), so the chat template is the same as ours.
    """

    def __init__(self, llama_cls, gguf: str | Path, stop_token_ids: list[int], threads: int) -> None:
        self.name, self.stop_token_ids = LLAMA_CPP, set(stop_token_ids)
        # n_ctx 0: the model's own context length, as our decode loop allows.
        self.llama = llama_cls(model_path=str(gguf), n_ctx=0, n_threads=threads, n_threads_batch=threads,
                               verbose=False)

    def decode(self, prompts: list[list[int]], max_new_tokens: int) -> list[Decoded]:
        return [self._one(p, max_new_tokens) for p in prompts]

    def _one(self, prompt: list[int], max_new_tokens: int) -> Decoded:
        # Without a reset llama-cpp-python reuses the cached KV of a shared prefix (the warm-up ran this prompt):
        # every call must prefill its whole prompt, as the other methods do.
        self.llama.reset()
        tokens: list[int] = []
        # top_k 1 at temperature 0 is greedy; no repeat penalty, as in ours.
        for token in self.llama.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                         reset=True):
            tokens.append(int(token))
            if token in self.stop_token_ids or len(tokens) >= max_new_tokens:
                break
        return Decoded(tokens)


def reference_method(target: Target, block_size: int, stop_token_ids: list[int],
                     draft_folder: str | Path | None) -> tuple[ReferenceMethod | None, str | None]:
    """The reference runtime when it can run here, else (None, why it was skipped)."""
    try:
        from dflash.model import DFlashDraftModel as ReferenceDraft
        from dflash.model import dflash_generate
    except ImportError:
        return None, f"{REFERENCE} skipped: the reference runtime dflash==0.1.0 is not installed (optional)"
    if draft_folder is None:
        return None, f"{REFERENCE} skipped: the draft is not a checkpoint folder the reference runtime can load"
    try:
        reference = ReferenceDraft.from_pretrained(str(draft_folder), dtype=target.dtype)
    except Exception as error:  # a third-party loader on another transformers version: report, don't abort the run
        return None, f"{REFERENCE} skipped: the reference runtime could not load {draft_folder}: {error}"
    reference = reference.to(target.device).eval()
    return ReferenceMethod(target, reference, dflash_generate, block_size, stop_token_ids), None


def llama_cpp_method(gguf: str | Path | None,
                     stop_token_ids: list[int]) -> tuple[LlamaCppMethod | None, str | None]:
    """llama.cpp on the target's GGUF file when it can run here, else (None, why it was skipped)."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None, (f"{LLAMA_CPP} skipped: llama-cpp-python is not installed (optional; "
                      "pip install llama-cpp-python)")
    if gguf is None:
        return None, f"{LLAMA_CPP} skipped: the target is not a GGUF file (llama.cpp runs the embedded target)"
    # The same thread count as torch: a method with more cores would be measuring the machine, not the decoder.
    try:
        return LlamaCppMethod(Llama, gguf, stop_token_ids, torch.get_num_threads()), None
    except ValueError as error:  # llama-cpp-python's "failed to load model": report, don't abort the run
        return None, f"{LLAMA_CPP} skipped: llama.cpp could not load {gguf}: {error}"


class ServerMethod:
    """Greedy decoding through one llama-server process (llama_server.LlamaServer), one prompt at a time; tau
    where it drafts."""

    def __init__(self, name: str, server, draft_max: int | None) -> None:
        self.name, self.server, self.draft_max = name, server, draft_max

    def decode(self, prompts: list[list[int]], max_new_tokens: int) -> list[Decoded]:
        from .llama_server import step_stats

        decoded = []
        for prompt in prompts:
            tokens, timings, log = self.server.complete(prompt, max_new_tokens)
            stats = None
            if self.draft_max is not None:
                stats = step_stats(log, len(tokens), self.draft_max, timings.get("draft_n_accepted", 0))
            decoded.append(Decoded(tokens, stats))
        return decoded

    def close(self) -> None:
        self.server.close()


def server_methods(name: str, draft, gguf: str | Path | None, draft_folder: str | Path | None,
                   draft_max: tuple[int | None, ...]) -> tuple[list[ServerMethod], str | None]:
    """`name` (LLAMA_SERVER, or LLAMA_DFLASH at each draft length), one server each, when it can run here; else
    ([], why not)."""
    from .llama_server import SERVER_ENV, LlamaServer, find_llama_server

    binary = find_llama_server()
    if importlib.util.find_spec("httpx") is None:
        return [], f"{name} skipped: it talks to llama-server with httpx, not installed (pip install httpx)"
    if binary is None:
        return [], (f"{name} skipped: no llama-server binary (set ${SERVER_ENV} or put it on the PATH; "
                    "benchmarks/README.md has the one-line build)")
    if gguf is None or (name == LLAMA_DFLASH and draft_folder is None):
        return [], f"{name} skipped: it needs the target's GGUF (the embedded target) and a draft folder"
    file, context = None, None
    if name == LLAMA_DFLASH:
        file, context = _export_draft(draft, gguf, draft_folder)
    methods = []
    try:
        for n in draft_max:
            label = name if len(draft_max) == 1 else f"{name}-n{n}"
            server = LlamaServer(binary, Path(gguf), file, n, torch.get_num_threads(), context or 8192)
            methods.append(ServerMethod(label, server, n))
    except RuntimeError as error:  # a binary without DFlash, a refused file: report, don't abort the run
        for method in methods:
            method.close()
        return [], f"{name} skipped: {error}"
    return methods, None


def _export_draft(draft, gguf, draft_folder) -> tuple[Path, int]:
    """The bench's draft as llama.cpp's DFlash GGUF in a temporary folder, with the proposal vocabulary it uses."""
    cfg, tensors = read_checkpoint(draft_folder)
    file = Path(tempfile.mkdtemp(prefix="blockdraft-dflash-")) / "draft.gguf"
    vocab = None if draft.vocab is None else draft.vocab.cpu()
    write_gguf_draft(file, cfg, tensors, gguf, "f16", vocab)
    return file, cfg.max_position_embeddings
