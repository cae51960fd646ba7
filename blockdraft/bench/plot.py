"""bench.png: tau histogram, per-position acceptance and speedup bars, drawn from the bench document only."""

from __future__ import annotations

from pathlib import Path


def save_plot(document: dict, out_dir: str | Path) -> Path:
    # The Agg canvas directly, never pyplot: no GUI backend, no global figure state, safe on a headless machine.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(15, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    tau_axes, position_axes, speed_axes = figure.subplots(1, 3)
    _acceptance(document, tau_axes, position_axes)
    _speedups(document, speed_axes)
    s, hw = document["settings"], document["hardware"]
    figure.suptitle(f"{s.get('prompt_set')} x{s['prompts']}, K={s['block_size']}, N={s['max_new_tokens']}, "
                    f"batch {s['batch_size']}, {s.get('dtype')} | {hw['device']} | {document['date']}", fontsize=9)
    path = Path(out_dir) / "bench.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path


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
        position_axes.plot(range(1, K), acc["per_position_acceptance"], marker="o", label=name)
    tau_axes.set(title="tau histogram (bonus counted)", xlabel="tau", ylabel="fraction of steps")
    position_axes.set(title="per-position acceptance", xlabel="draft slot k", ylabel="P(accept k | reached k)",
                      ylim=(0, 1.05))
    for axes in (tau_axes, position_axes):
        if accepted:
            axes.legend(fontsize=8)
        else:
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
    axes.bar(names, medians, yerr=[low, high], capsize=4, color="tab:blue")
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.set(title="speedup vs hf-generate (median, min-max)", ylabel="x")
    axes.tick_params(axis="x", labelrotation=20, labelsize=8)
