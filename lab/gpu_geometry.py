"""Two draft geometries trained on one GPU at once (docs/training.md §8, "Two geometries, one clock"): which
they are, and which draft comes back when both are evaluated."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Geometry:
    layers: int
    block_size: int
    layer_ids: tuple[int, ...]

    def name(self) -> str:
        return f"{self.layers} layers, K {self.block_size}, taps {list(self.layer_ids)}"


def geometries(args) -> tuple[Geometry, Geometry | None]:
    first = Geometry(args.layers, args.block_size, tuple(args.target_layer_ids))
    if not args.second_layers:
        return first, None
    return first, Geometry(args.second_layers, args.second_block_size or args.block_size,
                           tuple(args.second_target_layer_ids or args.target_layer_ids))


def choose(args, results: dict, second_draft: Path, log) -> str:
    """'second' (and its draft moved into --out) when its eval tau is within --second-margin of the first's;
    'first' otherwise, or when either eval gave no tau."""
    tau_first, tau_second = results["first"]["mean_tau"], results["second"]["mean_tau"]
    if tau_first is None or tau_second is None or tau_second < tau_first - args.second_margin:
        log.line(f"returned: the first draft (tau {tau_first} against the second's {tau_second})")
        return "first"
    shutil.rmtree(args.out / "draft")
    shutil.copytree(second_draft, args.out / "draft")
    log.line(f"returned: the second draft (tau {tau_second}, within {args.second_margin} of the first's {tau_first})")
    return "second"


def mean_tau(record: dict | None) -> float | None:
    """The mean over an eval's prompt sets of their mean tau (each set counts once), from its JSON record."""
    results = (record or {}).get("results") or {}
    taus = [r["mean_tau"] for r in results.values() if isinstance(r, dict) and "mean_tau" in r]
    return sum(taus) / len(taus) if taus else None
