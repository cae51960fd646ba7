"""A load sweep as a data product: one JSON document, the rich table drawn from it, and the summary line.

As in report.py, the document is the single source: `bench-serve.json` is the document, the table and
`bench-serve.png` read only the document, and the final stdout line is a digest of it. The hardware, prompt set,
max tokens and date stand beside every number (STYLE.md §2.12); the terms are defined in serve_stats.py.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .serve_servers import TARGET_ALONE
from .serve_stats import over_rounds, ratio
from .serve_sweep import SweepSettings

SCHEMA = "blockdraft-bench-serve/1"
JSON_NAME = "bench-serve.json"


def build_document(records: list[dict], settings: SweepSettings, *, hardware: dict, context: dict) -> dict:
    """The full record of a sweep: each round's record, which gains `vs_target_alone` (its total tok/s over the
    target alone's at the same point and round) where the target alone ran, and `points`, the rounds of each point
    and mode summarized (serve_stats.over_rounds). `context`: the caller's facts (prompt set, servers, model)."""
    reference = {(r["point"], r.get("repeat", 1)): r["total_tok_s"] for r in records if r["mode"] == TARGET_ALONE}
    records = [{**r, "vs_target_alone": ratio(r["total_tok_s"], reference.get((r["point"], r.get("repeat", 1))))}
               for r in records]
    closed = settings.points[0].concurrency is not None
    return {
        "schema": SCHEMA,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hardware": hardware,
        "settings": {**context, "max_tokens": settings.max_tokens, "time_limit_s": settings.time_limit,
                     "load": "closed loop (concurrent clients)" if closed else "open loop (Poisson arrivals)",
                     "points": [p.label for p in settings.points],
                     "requests_per_point": [p.requests for p in settings.points],
                     "modes": list(dict.fromkeys(r["mode"] for r in records)),
                     "repeats": settings.repeats,
                     "order": "interleaved per point, rotated by one mode per round",
                     "decoding": "greedy (temperature 0), streamed chat completions",
                     "definitions": "blockdraft/bench/serve_stats.py"},
        "records": records,
        "points": over_rounds(records),
    }


def save_json(document: dict, out_dir: str | Path) -> Path:
    path = Path(out_dir) / JSON_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path


def settings_line(document: dict) -> str:
    """Where and how the numbers were measured, in one line (printed above the table, titled on the plot)."""
    s, hw = document["settings"], document["hardware"]
    dtype = f", {hw['dtype']}" if hw.get("dtype") else ""
    weights = f", weights {hw['weights']}" if hw.get("weights") else ""
    return (f"{hw['device']}{dtype}{weights} | prompts {s['prompt_set']} x{s['prompts']} | max_tokens "
            f"{s['max_tokens']} | {s['load']} | {document['date']}")


def render(document: dict, console: Console) -> None:
    """The settings line, then one table row per point and mode, then the errors' first messages."""
    console.print(f"[bold]{settings_line(document)}[/bold]")
    console.print(_table(document))
    if document["settings"].get("repeats", 1) > 1:
        console.print(_rounds_table(document))
    if any(r["cut_short"] for r in document["records"]):
        console.print(f"[yellow]* cut short by --time-limit {document['settings']['time_limit_s']:g} s: "
                      "requests still running were cancelled and count as unfinished[/yellow]")
    for r in document["records"]:
        for message in r["first_errors"]:
            console.print(f"[yellow]{r['point']} {r['mode']}: {message}[/yellow]")


def _table(document: dict) -> Table:
    table = Table(title="per point and mode: latencies p50/p90/p99 in ms; tok/s per user (1/TPOT, median) and "
                        "total (all tokens / wall time)")
    rounds = document["settings"].get("repeats", 1) > 1
    for column in ("point", "round", "mode") if rounds else ("point", "mode"):
        table.add_column(column, no_wrap=True)
    for column in ("done/sent", "errors", "TTFT ms", "ITL ms", "TPOT ms", "tok/chunk", "user tok/s",
                   "total tok/s", "x target alone", "tau"):
        table.add_column(column, justify="right")
    for r in document["records"]:
        errors = ", ".join(f"{n} x {kind}" for kind, n in r["error_kinds"].items()) or "0"
        first = [r["point"] + ("*" if r["cut_short"] else ""), *([str(r.get("repeat", 1))] if rounds else []), r["mode"]]
        table.add_row(*first, f"{r['completed']}/{r['requests']}",
                      errors, _triple(r["ttft_ms"]), _triple(r["itl_ms"]), _number(r["tpot_ms"]["p50"]),
                      _number(r["tokens_per_chunk"], 2), _number(r["per_user_tok_s"]), _number(r["total_tok_s"]),
                      "-" if r["vs_target_alone"] is None else f"{r['vs_target_alone']:.2f}x",
                      _number(r["mean_tau"], 2))
    return table


def _rounds_table(document: dict) -> Table:
    """Per point and mode over the rounds: medians, with the min-max range of the rounds in brackets."""
    table = Table(title=f"per point and mode over {document['settings']['repeats']} rounds: median [min-max]")
    for column in ("point", "mode"):
        table.add_column(column, no_wrap=True)
    for column in ("done/sent", "user tok/s", "total tok/s", "x target alone", "tau"):
        table.add_column(column, justify="right")
    for p in document["points"]:
        table.add_row(p["point"] + ("*" if p["cut_short"] else ""), p["mode"], f"{p['completed']}/{p['requests']}",
                      _spread(p, "per_user_tok_s"), _spread(p, "total_tok_s"), _spread(p, "vs_target_alone", 2, "x"),
                      _spread(p, "mean_tau", 2))
    return table


def _spread(point: dict, name: str, digits: int = 1, unit: str = "") -> str:
    value, span = point[name], point[f"{name}_range"]
    if value is None:
        return "-"
    return f"{value:.{digits}f}{unit} [{span[0]:.{digits}f}-{span[1]:.{digits}f}]"


def _triple(ms: dict) -> str:
    return "/".join(_number(ms[key], 0) for key in ("p50", "p90", "p99"))


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def summary_line(document: dict, out_dir: str | Path | None = None) -> str:
    """One JSON line: settings, and per point and mode total and per-user tok/s, errors and the ratio (medians
    over the rounds, with the ratio's range, when there were several)."""
    s = document["settings"]
    points: dict[str, dict] = {}
    rounds = s.get("repeats", 1) > 1
    for p in document["points"]:
        entry = {"total_tok_s": p["total_tok_s"], "per_user_tok_s": p["per_user_tok_s"],
                 "ttft_p50_ms": p["ttft_p50_ms"], "completed": p["completed"],
                 "errors": p["errors"], "cut_short": p["cut_short"], "vs_target_alone": p["vs_target_alone"]}
        if rounds:  # medians over the rounds, and the ratio's range
            entry |= {"rounds": p["rounds"], "vs_target_alone_range": p["vs_target_alone_range"]}
        points.setdefault(p["point"], {})[p["mode"]] = entry
    line = {"bench": "serve", "prompts": s["prompt_set"], "max_tokens": s["max_tokens"], "load": s["load"],
            "device": document["hardware"].get("device"), "date": document["date"], "points": points}
    if out_dir is not None:
        line["out"] = str(out_dir)
    return json.dumps(line, separators=(",", ":"))
