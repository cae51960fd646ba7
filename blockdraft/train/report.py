"""What a training run shows and leaves behind: a rich progress bar, `metrics.jsonl` and `curves.png`.

Records are JSON objects with `split` ("train" or "val") and `step`; train records carry lr, loss, acc
[acc_1..acc_{K-1}] and grad_norm, val records loss, acc and the teacher-forced tf_tau (docs/training.md §4).
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ..errors import InputError


class MetricsLog:
    """Append-only `metrics.jsonl`; on resume, records past the checkpoint's step are dropped (they are redone)."""

    def __init__(self, path: Path, resume_step: int | None = None) -> None:
        self.path = path
        self.records: list[dict] = []
        if resume_step is not None and path.is_file():
            self.records = [r for r in _read_records(path) if r["step"] <= resume_step]
        path.write_text("".join(json.dumps(r) + "\n" for r in self.records), encoding="utf-8")

    def write(self, record: dict) -> None:
        self.records.append(record)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")


def _read_records(path: Path) -> list[dict]:
    """The records of a metrics.jsonl; a last line cut off by a killed run is dropped (its step is redone)."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):
                break  # written in part when the run was killed
            raise InputError(f"{path}, line {number}: not valid JSON ({error.msg}); the run's log is damaged: "
                             "delete that line, or resume into a new --out from RUN/checkpoint") from error
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise InputError(f"{path}, line {number}: not a metrics record (a JSON object with an integer `step`); "
                             "delete that line")
        records.append(record)
    return records


def plot_curves(records: list[dict], path: Path) -> None:
    """Loss (left) and acc_1 / teacher-forced tau (right) against step, train and held-out."""
    from matplotlib.figure import Figure  # the object API renders with Agg: no display, no global backend

    fig = Figure(figsize=(11, 4), layout="constrained")
    loss_ax, acc_ax = fig.subplots(1, 2)
    tau_ax = acc_ax.twinx()
    for split, style in (("train", "-"), ("val", "o-")):
        rows = [r for r in records if r["split"] == split and r.get("loss") is not None]
        steps = [r["step"] for r in rows]
        loss_ax.plot(steps, [r["loss"] for r in rows], style, label=f"{split} loss")
        acc_ax.plot(steps, [r["acc"][0] for r in rows], style, label=f"{split} acc_1")
        if split == "val":
            tau_rows = [r for r in rows if r.get("tf_tau") is not None]
            tau_ax.plot([r["step"] for r in tau_rows], [r["tf_tau"] for r in tau_rows], "s--", color="tab:green",
                        label="val tf-tau")
    loss_ax.set(xlabel="step", ylabel="weighted CE", title="loss")
    acc_ax.set(xlabel="step", ylabel="acc_1", title="accuracy and teacher-forced tau")
    tau_ax.set_ylabel("tf-tau")
    loss_ax.legend()
    acc_ax.legend(loc="upper left")
    tau_ax.legend(loc="lower right")
    fig.savefig(path, dpi=100)


def progress_bar(enabled: bool) -> Progress:
    return Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                    TimeRemainingColumn(), disable=not enabled)


def progress_info(train: dict | None, val: dict | None, lr: float) -> str:
    """loss, lr, acc_1 (train) and tf-tau (held-out) for the progress bar."""
    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    train, val = train or {}, val or {}
    acc_1 = (train.get("acc") or [None])[0]
    return (f"loss {fmt(train.get('loss'), '.3f')}  lr {lr:.2e}  acc_1 {fmt(acc_1, '.3f')}  "
            f"tf-tau {fmt(val.get('tf_tau'), '.2f')}")
