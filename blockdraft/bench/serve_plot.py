"""bench-serve.png: the throughput-latency trade-off of each mode, drawn from the sweep document only.

Per-user tok/s (how fast one answer streams) on x, total tok/s (what the server delivers to everyone) on y: one
line per mode through its points in sweep order, each point annotated with its concurrency or rate. Up and to the
right is better; a mode whose line lies above and right of another's is better at every load. Each line's name
stands beside its first point, in its colour, so no legend has to be matched by colour. With several rounds a
point is its rounds' medians, with bars over their min-max range.
"""

from __future__ import annotations

from pathlib import Path

from .plot import agg_figure, save_figure
from .serve_report import settings_line

PNG_NAME = "bench-serve.png"


def save_plot(document: dict, out_dir: str | Path) -> Path:
    return save_figure(draw(document), Path(out_dir) / PNG_NAME)


def draw(document: dict):
    figure = agg_figure((9, 6.5))
    axes = figure.subplots()
    plotted = [p for p in document["points"] if p["per_user_tok_s"] is not None]
    for index, mode in enumerate(document["settings"]["modes"]):
        records = [r for r in plotted if r["mode"] == mode]
        if records:
            _mode_line(axes, mode, records, index)
    if plotted:
        # From 0, so that distances read as ratios; a fifth more room for the labels right of and above points.
        axes.set_xlim(0, 1.2 * max(p["per_user_tok_s_range"][1] for p in plotted))
        axes.set_ylim(0, 1.2 * max(p["total_tok_s_range"][1] for p in plotted))
    else:  # every request failed: an empty chart says so instead of drawing nothing silently
        axes.text(0.5, 0.5, "no completed requests to plot (see the errors in bench-serve.json)", ha="center",
                  transform=axes.transAxes)
    axes.set(xlabel="per-user tok/s (median of 1 / TPOT)", ylabel="total tok/s (all completion tokens / wall time)")
    axes.grid(alpha=0.3)
    if any(r["cut_short"] for r in document["records"]):
        axes.annotate("* cut short by the time limit", (1, 0), xycoords="axes fraction", xytext=(-4, 4),
                      textcoords="offset points", ha="right", va="bottom", fontsize=8)
    figure.suptitle(f"Serving under load: {settings_line(document)}", fontsize=9, wrap=True)
    return figure


def _mode_line(axes, mode: str, records: list[dict], index: int) -> None:
    xs = [r["per_user_tok_s"] for r in records]
    ys = [r["total_tok_s"] for r in records]
    (line,) = axes.plot(xs, ys, marker="o", linewidth=1.8)
    if any(r["rounds"] > 1 for r in records):  # the rounds' min-max around each median
        xerr = [[x - r["per_user_tok_s_range"][0] for r, x in zip(records, xs)],
                [r["per_user_tok_s_range"][1] - x for r, x in zip(records, xs)]]
        yerr = [[y - r["total_tok_s_range"][0] for r, y in zip(records, ys)],
                [r["total_tok_s_range"][1] - y for r, y in zip(records, ys)]]
        axes.errorbar(xs, ys, xerr=xerr, yerr=yerr, fmt="none", ecolor=line.get_color(), alpha=0.6, capsize=3)
    # Point names below and right of the first mode's points, above and left of the second's: at high load the
    # modes' points meet, and names on the same side would print over each other.
    offset, align = ((5, -11), "left") if index % 2 == 0 else ((-5, 6), "right")
    for r, x, y in zip(records, xs, ys):
        axes.annotate(r["point"] + ("*" if r["cut_short"] else ""), (x, y), xytext=offset, ha=align,
                      textcoords="offset points", fontsize=8, color=line.get_color())
    # The mode's name beside its lightest-load point, in its colour: the line's label without a legend. Modes
    # lie furthest apart there (at high load every mode's total tends to the machine's limit); where their points
    # meet anyway (a sweep of high loads only), the names stand one above the other, never on top of each other.
    axes.annotate(mode, (xs[0], ys[0]), xytext=(6, 6 + 16 * index), textcoords="offset points", fontsize=11,
                  fontweight="bold", color=line.get_color())
