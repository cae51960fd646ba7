"""A benchmark run as a data product: one JSON document, the rich tables drawn from it, and the summary line.

The document is the single source: `bench.json` is the document, the printed tables and `bench.png` read
only the document, and the final stdout line is a digest of it. Every number sits beside the hardware,
dtype, prompt set, K and output length it was measured with (STYLE.md §2.12).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .methods import BASELINE, HF_GENERATE, LLAMA_CPP, LLAMA_DFLASH, LLAMA_SERVER, OURS
from .runner import BenchRun, BenchSettings
from .summary import first_difference, merged_acceptance, summarize_method

SCHEMA = "blockdraft-bench/1"
REFERENCES = (HF_GENERATE, BASELINE)  # speedups are reported against both


def build_document(run: BenchRun, settings: BenchSettings, *, hardware: dict, context: dict,
                   notes: list[str]) -> dict:
    """The full record of a run. `context` holds the caller's facts (prompt set, target, draft, dtype, device)."""
    rates = {name: {r["batch"]: r["tokens_per_second"] for r in run.rows if r["method"] == name}
             for name in REFERENCES if name in run.methods}
    sampled = settings.sampling is not None and not settings.sampling.greedy
    # Sampled texts are separate draws, whose distributions alone agree, except ours sampling coupled: the same
    # seeds then give the same sample, so those are compared as greedy texts are.
    compared = [n for n in run.methods if not sampled or (settings.coupled and n in OURS)]
    summary, acceptance = {}, {}
    for name in run.methods:
        rows = [r for r in run.rows if r["method"] == name]
        summary[name] = summarize_method(rows, rates)
        summary[name]["mismatches_vs_ours_baseline"] = _mismatch_count(run, name) if name in compared else None
        pooled = merged_acceptance(run.stats.get(name, []), summary[name]["new_tokens"], summary[name]["seconds"])
        if pooled is not None:
            acceptance[name] = pooled.as_dict()
    return {
        "schema": SCHEMA,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hardware": hardware,
        "settings": {**context, "block_size": settings.block_size, "max_new_tokens": settings.max_new_tokens,
                     "batch_size": settings.batch_size, "warmup": settings.warmup, "prompts": len(run.prompt_ids),
                     "order": "interleaved per batch, rotated by one method per batch",
                     "rounds": settings.rounds,
                     "decoding": _decoding(settings)},
        "methods": run.methods,
        "notes": notes,
        "summary": summary,
        "acceptance": acceptance,
        "mismatches": _mismatches(run, compared),
        "engine_checks": _engine_checks(run) if not sampled else [],
        "rows": run.rows,
    }


def _decoding(settings: BenchSettings) -> str:
    """'greedy', or the sampling parameters every method sampled with (its seed: the bench's base seed)."""
    s = settings.sampling
    if s is None or s.greedy:
        return "greedy"
    sampler = "coupled" if settings.coupled else "rejection"
    return (f"sampled ({sampler}): temperature {s.temperature:g}, top_k {s.top_k}, top_p {s.top_p:g}, "
            f"min_p {s.min_p:g}, seed {s.seed}")


def _mismatches(run: BenchRun, names: list[str]) -> list[dict]:
    """Prompts where a method of `names` gives other tokens than ours-baseline, with the first differing index.

    Greedy speculative decoding must reproduce the baseline; in bf16 a block verify and a one-token step can
    round a near-tie differently, so differences are reported, not raised.
    """
    if BASELINE not in run.tokens:
        return []
    found = []
    for name in names:
        for i, (base, other) in enumerate(zip(run.tokens[BASELINE], run.tokens[name])):
            index = first_difference(base, other) if name != BASELINE else None
            if index is not None:
                found.append({"method": name, "prompt": run.prompt_ids[i], "first_difference": index})
    return found


def _engine_checks(run: BenchRun) -> list[dict]:
    """llama.cpp's DFlash against llama.cpp alone, per prompt: speculative decoding must give its own engine's
    plain text (our baseline's may differ: another engine rounds otherwise), its server's when that ran, else
    llama-cpp-python's. Where not, the first differing index and the two tokens there."""
    reference = next((n for n in (LLAMA_SERVER, LLAMA_CPP) if n in run.tokens), None)
    if reference is None:
        return []
    checks = []
    for name in (n for n in run.methods if n.startswith(LLAMA_DFLASH)):
        for i, (base, other) in enumerate(zip(run.tokens[reference], run.tokens[name])):
            index = first_difference(base, other)
            tokens = None if index is None else [_token_at(base, index), _token_at(other, index)]
            checks.append({"method": name, "reference": reference, "prompt": run.prompt_ids[i],
                           "first_difference": index, "tokens": tokens})
    return checks


def _token_at(tokens: list[int], index: int) -> int | None:
    return tokens[index] if index < len(tokens) else None  # None: this one had stopped


def engine_lines(document: dict) -> list[str]:
    """One line per llama.cpp DFlash method: how many prompts equal llama.cpp alone, and where not, the token."""
    by_method: dict[str, list[dict]] = {}
    for check in document.get("engine_checks", []):
        by_method.setdefault(check["method"], []).append(check)
    lines = []
    for name, checks in by_method.items():
        differ = [c for c in checks if c["first_difference"] is not None]
        reference = checks[0]["reference"]
        line = f"{name}: {len(checks) - len(differ)} of {len(checks)} prompts equal {reference}'s text"
        if differ:
            line += "; " + ", ".join(f"{c['prompt']} from new token {c['first_difference']} ({reference} "
                                     f"{c['tokens'][0]}, {name} {c['tokens'][1]})" for c in differ[:3])
        lines.append(line)
    return lines


def _mismatch_count(run: BenchRun, name: str) -> int | None:
    if BASELINE not in run.tokens:
        return None
    return sum(first_difference(b, o) is not None for b, o in zip(run.tokens[BASELINE], run.tokens[name]))


def summary_line(document: dict, out_dir: str | Path | None = None) -> str:
    """One JSON line: settings and, per method, median tokens/s and median speedups; mean tau where measured."""
    s = document["settings"]
    methods = {}
    for name, m in document["summary"].items():
        entry = {"tok_s": _round(_median(m["tokens_per_second"])),
                 "speedup_vs_hf_generate": _round(_median(m.get("speedup_vs_hf_generate"))),
                 "mismatches": m["mismatches_vs_ours_baseline"]}
        if name in document["acceptance"]:
            entry["mean_tau"] = document["acceptance"][name]["mean_tau"]
        checks = [c for c in document.get("engine_checks", []) if c["method"] == name]
        if checks:
            entry["equal_llama_cpp_alone"] = sum(c["first_difference"] is None for c in checks)
        methods[name] = entry
    line = {"bench": s.get("prompt_set"), "prompts": s["prompts"], "K": s["block_size"], "N": s["max_new_tokens"],
            "batch_size": s["batch_size"], "dtype": s.get("dtype"), "device": document["hardware"].get("device"),
            "date": document["date"], "methods": methods}
    if out_dir is not None:
        line["out"] = str(out_dir)
    return json.dumps(line, separators=(",", ":"))


def save_json(document: dict, out_dir: str | Path) -> Path:
    path = Path(out_dir) / "bench.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path


def render(document: dict, console: Console) -> None:
    """The settings line, the per-method table and the acceptance table."""
    s, hw = document["settings"], document["hardware"]
    weights = f" | weights {hw['weights']}" if hw.get("weights") else ""
    console.print(f"[bold]{hw['device']}[/bold] | torch {hw['torch']} | transformers {hw['transformers']}{weights} | "
                  f"{document['date']}")
    window = s.get("draft_window")
    bounded = f" | draft context: first {window['sinks']} + latest {window['window']} positions" if window else ""
    rounds = f" | each batch's time the median of {s['rounds']} rounds" if s.get("rounds", 1) > 1 else ""
    console.print(f"dtype {s.get('dtype')} | prompts {s.get('prompt_set')} x{s['prompts']} | K={s['block_size']} "
                  f"| N={s['max_new_tokens']} new tokens | batch {s['batch_size']} | {s['decoding']}, same stop tokens"
                  f"{rounds}{bounded}")
    console.print(_speed_table(document))
    for name, acc in document["acceptance"].items():
        console.print(_acceptance_table(name, acc))
    for note in document["notes"]:
        console.print(f"[yellow]note: {note}[/yellow]")
    for line in mismatch_lines(document):
        console.print(f"[yellow]{line}[/yellow]")
    for line in engine_lines(document):
        console.print(line)


def mismatch_lines(document: dict) -> list[str]:
    """Per method, how many of the run's prompts differ from ours-baseline, then why they may (none: all agree).

    Counted per method over the N prompts: a sum over methods would report more differing prompts than there are.
    """
    where: dict[str, list[str]] = {}
    for m in document["mismatches"]:  # one entry per (method, prompt)
        where.setdefault(m["method"], []).append(f"{m['prompt']} from new token {m['first_difference']}")
    if not where:
        return []
    n = document["settings"]["prompts"]
    lines = []
    for name, found in where.items():
        shown = ", ".join(found[:3]) + (f", and {len(found) - 3} more" if len(found) > 3 else "")
        verb = "differs" if len(found) == 1 else "differ"
        lines.append(f"{name}: {len(found)} of {n} prompt{'s' if n != 1 else ''} {verb} from ours-baseline ({shown})")
    return lines + ["(bf16 near-ties can flip; --dtype float32 checks bit for bit on CPU, and `generate --compare` "
                    "names a difference's margin); see bench.json's mismatches"]


def _speed_table(document: dict) -> Table:
    unit, units = ("prompt", "prompts") if document["settings"]["batch_size"] == 1 else ("batch", "batches")
    table = Table(title=f"tokens/s over {units}; speedups: median of per-{unit} ratios (ranges in bench.json)")
    table.add_column("method", no_wrap=True)
    for column in ("tok/s", "min-max", "IQR", "vs hf-generate", "vs ours-baseline", "mean tau", "= baseline"):
        table.add_column(column, justify="right")
    prompts = document["settings"]["prompts"]
    for name, m in document["summary"].items():
        t = m["tokens_per_second"]
        acc = document["acceptance"].get(name)
        mismatches = m["mismatches_vs_ours_baseline"]
        table.add_row(
            name, f"{t['median']:.1f}", f"{t['min']:.1f}-{t['max']:.1f}", f"{t['q1']:.1f}-{t['q3']:.1f}",
            _speedup(m.get("speedup_vs_hf_generate")), _speedup(m.get("speedup_vs_ours_baseline")),
            f"{acc['mean_tau']:.2f}" if acc else "-",
            "-" if mismatches is None else f"{prompts - mismatches}/{prompts}",
        )
    return table


def _acceptance_table(name: str, acc: dict) -> Table:
    K, bins = acc["block_size"], acc["tau_bins"]  # K + 1 bins: tau 1..K, then >K (metrics.tau_bins)
    kinds = "".join(f", {acc[key]} {label}" for key, label in (("plain_steps", "plain"), ("lookup_steps", "lookup"))
                    if acc.get(key))
    table = Table(title=f"{name}: mean tau {acc['mean_tau']:.3f} over {acc['steps']} steps (bonus counted{kinds}), "
                        f"K={K}")
    table.add_column("")
    for label in bins:
        table.add_column(label, justify="right")
    table.add_row("tau histogram", *(str(n) for n in acc["tau_histogram"]))
    # Slots 1..K-1 only: slot K is the bonus's, and the overflow bin has no one slot.
    table.add_row("accept rate at slot", *(f"{r:.2f}" for r in acc["per_position_acceptance"]), "", "")
    return table


def _speedup(value: dict | None) -> str:
    return "-" if value is None else f"{value['median']:.2f}x"


def _median(value: dict | None) -> float | None:
    return None if value is None else value["median"]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
