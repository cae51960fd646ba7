"""Same-run benchmarks: the target alone, HF generate, HF prompt lookup and DFlash speculative decoding.

    methods.py  the decoders compared, behind one `decode(prompts, max_new_tokens)` call
    decoded.py  the methods' names and what one returns
    external.py the other runtimes' methods (reference, llama.cpp, llama-server), where they run
    runner.py   warm-up, interleaved per-batch runs, equal truncation, CUDA-synchronized timing
    summary.py  median/spread, paired speedups, token comparison; pure
    report.py   the JSON document, the rich tables, the final JSON line
    plot.py     bench.png from the document

`blockdraft bench serve`, a server under load over HTTP (no model in this process):

    serve_stats.py    TTFT, ITL, TPOT, per-user and total tok/s from request timings; pure
    serve_load.py     streamed requests, one point of closed- or open-loop load
    serve_servers.py  `blockdraft serve` processes started on loopback ports and stopped
    serve_sweep.py    every point on every server, interleaved
    serve_report.py   the JSON document, the rich table, the final JSON line
    serve_plot.py     bench-serve.png, the per-user vs total tok/s curve

`benchmark` takes token-id prompts, so it runs on any target, tokenizer or not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from ..decode.requests import eos_ids
from ..hardware import describe
from ..model.draft import DFlashDraftModel
from ..model.target import Target
from .methods import build_methods, choose_methods
from .report import build_document
from .runner import BenchSettings, run_bench

__all__ = ["BenchSettings", "benchmark"]


def benchmark(target: Target, draft: DFlashDraftModel, prompts: list[list[int]], settings: BenchSettings, *,
              prompt_ids: Sequence[str] | None = None, context: dict | None = None,
              draft_folder: str | Path | None = None, gguf: str | Path | None = None,
              on_progress: Callable[[int, int, str], None] | None = None) -> dict:
    """Run every available method on `prompts` (token ids) and return the bench document (report.py).

    `draft_folder` and `gguf` (the target's GGUF file) enable the reference runtime and llama.cpp."""
    # One stop set for every method, the one our decode loop uses by default: equal stopping.
    stop_token_ids = sorted(eos_ids(target))
    methods, notes = build_methods(target, draft, settings.block_size, stop_token_ids, draft_folder,
                                   choose_methods(settings.methods), sampling=settings.sampling,
                                   coupled=settings.coupled, gguf=gguf, llama_draft_max=settings.llama_draft_max,
                                   measure_costs=settings.measure_costs)
    try:
        run = run_bench(target, methods, prompts, settings, stop_token_ids, prompt_ids, on_progress)
    finally:  # llama.cpp's DFlash runs in server processes: stop them however the run ends
        for method in methods:
            if hasattr(method, "close"):
                method.close()
    context = {"dtype": str(target.dtype).replace("torch.", ""), "device": str(target.device), **(context or {}),
               "stop_token_ids": stop_token_ids}
    hardware = describe(target.device, target.dtype, target.quantized)
    return build_document(run, settings, hardware=hardware, context=context, notes=notes)

