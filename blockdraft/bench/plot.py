"""bench.png: tau histogram, per-position acceptance and speedup bars, drawn from the bench document only."""

from __future__ import annotations

from pathlib import Path

DPI = 110


def save_plot(document: dict, out_dir: str | Path) -> Path:
    return save_figure(draw(document), Path(out_dir) / "bench.png")


def save_figure(figure, path: Path) -> Path:
    """Write `figure` as a PNG at `path` (its folder made if needed); the bench's plots all go through here."""
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI)
    return path


def agg_figure(size: tuple[float, float]):
    """A figure on the Agg canvas directly, never pyplot: no GUI backend, no global figure state, safe on a
    headless machine."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def draw(document: dict):
    """The figure of bench.png: three panels side by side, the acceptance legend below them."""
    # Wide enough for three panels side by side; the acceptance legend goes below them, not over the bars.
    figure = agg_figure((16, 5.5))
    tau_axes, position_axes, speed_axes = figure.subplots(1, 3)
    _acceptance(document, tau_axes, position_axes)
    _speedups(document, speed_axes)
    s, hw = document["settings"], document["hardware"]
    figure.suptitle(f"{s.get('prompt_set')} x{s['prompts']}, K={s['block_size']}, N={s['max_new_tokens']}, "
                    f"batch {s['batch_size']}, {s.get('dtype')} | {hw['device']} | {document['date']}", fontsize=9)
    return figure


def _acceptance(document: dict, tau_axes, position_axes) -> None:
    accepted = document["acceptance"]
    count = max(len(accepted), 1)
    width = 0.8 / count
    for i, (name, acc) in enumerate(accepted.items()):
        K, steps = acc["block_size"], max(acc["steps"], 1)
        offset = (i - (count - 1) / 2) * width
        # K + 1 bins: tau 1..K at x = 1..K, the overflow bin ">K" at x = K + 1.
        tau_axes.bar([t + offset for t in range(1, K + 2)], [n / steps for n in acc["tau_histogram"]], width,
                     label=f"{name} (mean tau {acc['mean_tau']:.2f})")
        tau_axes.set_xticks(range(1, K + 2), acc["tau_bins"])
        position_axes.set_xticks(range(1, K))  # whole slots, not 1.25
        position_axes.plot(range(1, K), acc["per_position_acceptance"], marker="o", label=name)
    tau_axes.set(title="tau histogram (bonus counted)", xlabel="tau", ylabel="fraction of steps")
    position_axes.set(title="per-position acceptance", xlabel="draft slot k", ylabel="P(accept k | reached k)",
                      ylim=(0, 1.05))
    if accepted:  # one legend for both panels, below the figure: inside either it hides the tallest bars
        handles, labels = tau_axes.get_legend_handles_labels()
        tau_axes.figure.legend(handles, labels, loc="outside lower center", ncols=min(count, 3), fontsize=8)
    else:
        for axes in (tau_axes, position_axes):
            axes.text(0.5, 0.5, "no speculative method ran", ha="center", transform=axes.transAxes)


def _speedups(document: dict, axes) -> None:
    names, medians, low, high = [], [], [], []
    for name, m in document["summary"].items():
        speedup = m.get("speedup_vs_hf_generate")
        if speedup is None:
            continue
        names.append(name)
        medians.append(speedup["median"])
        low.append(speedup["median"] - speedup["min"])
        high.append(speedup["max"] - speedup["median"])
    # Horizontal bars: each method's name gets a row of its own, however long, so no two labels can collide.
    rows = range(len(names))
    axes.barh(rows, medians, xerr=[low, high], capsize=3, color="tab:blue")
    axes.set_yticks(rows, names, fontsize=8)
    axes.invert_yaxis()  # the first method on top, as in the tables
    for row, median, above in zip(rows, medians, high):
        axes.annotate(f"{median:.2f}x", (median + above, row), xytext=(4, 0), textcoords="offset points",
                      va="center", fontsize=8)
    axes.axvline(1.0, color="grey", linewidth=0.8)
    axes.margins(x=0.15)  # room for the value labels past the longest whisker
    axes.set(title="speedup vs hf-generate (median, min-max)", xlabel="x")
