"""What the width policy expected of each step against what the step returned, by kind of step.

    python benchmarks/step_truth.py --weights q4 --prompts humaneval --limit 8
    python benchmarks/step_truth.py --weights bf16 --prompts mt-bench --draft runs/stage18/run/draft

The default decoder (adaptive trees with prompt lookup) of the embedded target and the shipped draft decodes the
prompts, greedy, and every step is timed and sorted by kind: plain (the anchor alone), ragged (looked-up runs on
a plain step, no draft), drafted (the draft's tree, with or without a grafted run). For each kind it reports the
steps, the tokens they committed, their measured seconds against what the cost model priced them at, and their
tokens per second against plain steps'; for drafted steps also the tokens the policy expected (its E(w) when it
chose) against the tokens they returned. A drafted step pays only where its tokens per second beat a plain step's:
where it does not, the line says whether the cost model priced it too cheap or the policy expected too many tokens.
The cost model prices a plain step at its fastest and every other kind in plain steps (costs.py), so each kind's
cost in plain steps, measured against priced, is the comparison that decides; the plain step's own ms carry the
machine's spells.
The target alone decodes each prompt just before the default mode does (its tok/s is printed beside).
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch

from blockdraft.hardware import describe_line


def step_kind(proposal) -> str:
    """plain, ragged (looked-up runs without the draft), drafted (the draft's chain or tree, runs grafted or not)."""
    if proposal.drafted:
        return "drafted"
    return "plain" if proposal.tokens.shape[1] == 1 else "ragged"


def priced_seconds(costs, proposal) -> float:
    """What the cost model prices a 1-row step of this proposal at."""
    nodes = proposal.tokens.shape[1]
    if proposal.drafted:
        return costs.seconds(1, nodes, drafted=True)
    if proposal.widths is not None:
        return costs.ragged_seconds(1, int(proposal.widths.sum()) - len(proposal.widths))
    return costs.seconds(1, nodes, drafted=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", choices=["q4", "bf16"], default="q4")
    parser.add_argument("--prompts", default="humaneval")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--draft", default=None, help="a draft folder (default: the shipped draft)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import blockdraft.decode.generate as generate
    from blockdraft.api import encode
    from blockdraft.decode.decoder import Decoder
    from blockdraft.decode.options import PRESETS
    from blockdraft.io.drafts import load_draft
    from blockdraft.io.targets import load_target
    from blockdraft.prompts import load_prompts

    target = load_target(weights=args.weights)
    draft = load_draft(args.draft, target)
    decoder = Decoder(target, draft, PRESETS["default"])
    alone = Decoder(target, None, PRESETS["chain"])
    prompts = [encode(target, list(p.messages)) for p in load_prompts(args.prompts)[: args.limit]]
    print(describe_line(), f"torch {torch.__version__}, {args.threads} threads, weights {args.weights}, "
          f"{args.prompts} x{len(prompts)}, K={draft.config.block_size}, N={args.max_new_tokens}, greedy")

    log = StepLog(generate)
    with log:
        decoder.generate([prompts[0]], max_new_tokens=16)  # warm-up: kernels, the cost model, the packed heads
    alone.generate([prompts[0]], max_new_tokens=16)
    log.records.clear()
    alone_seconds, alone_tokens, ours_seconds, ours_tokens = 0.0, 0, 0.0, 0
    for prompt in prompts:
        start = time.perf_counter()
        alone_tokens += len(alone.generate([prompt], max_new_tokens=args.max_new_tokens)[0].tokens)
        alone_seconds += time.perf_counter() - start
        with log:
            start = time.perf_counter()
            ours_tokens += len(decoder.generate([prompt], max_new_tokens=args.max_new_tokens)[0].tokens)
            ours_seconds += time.perf_counter() - start

    report = summarise(log.records)
    print(f"target alone {alone_tokens / alone_seconds:.1f} tok/s; default {ours_tokens / ours_seconds:.1f} tok/s "
          f"({alone_seconds / alone_tokens * ours_tokens / ours_seconds:.3f}x)")
    plain_rate = report.get("plain", {}).get("tokens_per_s")
    plain = report.get("plain")
    for kind, row in report.items():
        vs = f", {row['tokens_per_s'] / plain_rate:.3f}x a plain step's rate" if plain_rate else ""
        if plain and kind != "plain":  # what the policy weighs: a step's cost in plain steps (a scale cancels)
            vs += (f"; {row['ms_per_step'] / plain['ms_per_step']:.2f} plain steps, priced at "
                   f"{row['priced_ms_per_step'] / plain['priced_ms_per_step']:.2f}")
        expected = (f"; expected {row['expected_tokens']:.2f} tokens a step, returned {row['tokens_per_step']:.2f}"
                    if row.get("expected_tokens") is not None else "")
        print(f"{kind:8s} {row['steps']:5d} steps, {row['tokens_per_step']:.2f} tokens a step, measured "
              f"{row['ms_per_step']:.2f} ms a step, priced {row['priced_ms_per_step']:.2f} "
              f"({row['ms_per_step'] / row['priced_ms_per_step']:.2f}x){vs}{expected}")
    print(json.dumps({"weights": args.weights, "prompts": args.prompts, "limit": len(prompts),
                      "N": args.max_new_tokens, "alone_tok_s": alone_tokens / alone_seconds,
                      "default_tok_s": ours_tokens / ours_seconds, "kinds": report}))


class StepLog:
    """While entered, every step of a decode whose proposer has an adaptive width policy is timed and recorded
    (`records`: kind, nodes, seconds, priced seconds, committed tokens, the policy's expected tokens for the width
    it chose, whether looked-up tokens were verified), by standing in for the step the engine (`generate`, the
    module decode/generate.py) calls. Steps of other proposers (the cost model's own timing) run untouched."""

    def __init__(self, generate) -> None:
        self.generate, self.step, self.records = generate, generate.step, []

    def __enter__(self) -> "StepLog":
        self.generate.step = self.timed
        return self

    def __exit__(self, *exc) -> None:
        self.generate.step = self.step

    def timed(self, state, target, proposer, selector, stats):
        policy = getattr(proposer, "policy", None)
        if not hasattr(policy, "gains"):
            return self.step(state, target, proposer, selector, stats)
        made, propose = [], proposer.propose

        def keep(*args, **kwargs):  # the step's proposal, for its kind
            made.append(propose(*args, **kwargs))
            return made[-1]

        proposer.propose = keep
        before = policy_expectation(proposer)
        start = time.perf_counter()
        try:
            events = self.step(state, target, proposer, selector, stats)
        finally:
            del proposer.propose
        seconds = time.perf_counter() - start
        proposal = made[0]
        nodes = int(proposal.tokens.shape[1])
        self.records.append(dict(kind=step_kind(proposal), nodes=nodes, seconds=seconds,
                                 priced=priced_seconds(policy.costs, proposal),
                                 tokens=sum(len(new) for _, new in events),
                                 expected=before.get(getattr(proposer, "size", nodes)), lookup=bool(proposal.lookup)))
        return events


def policy_expectation(proposer) -> dict[int, float]:
    """The expected committed tokens E(w) of a draft step of each width w, as the draft's policy holds them now."""
    policy = proposer.policy
    gains = policy.gains().tolist()
    return {w: gains[w - 1] for w in range(1, len(gains) + 1)}


def summarise(records: list[dict]) -> dict:
    """Per kind: steps, tokens per step, measured and priced ms per step, tokens per second, expected tokens."""
    by_kind = defaultdict(list)
    for record in records:
        by_kind[record["kind"]].append(record)
    report = {}
    for kind, rows in sorted(by_kind.items()):
        seconds, tokens = sum(r["seconds"] for r in rows), sum(r["tokens"] for r in rows)
        expected = [r["expected"] for r in rows if r["expected"] is not None and kind == "drafted"]
        report[kind] = {"steps": len(rows), "tokens_per_step": tokens / len(rows),
                        "ms_per_step": seconds / len(rows) * 1e3,
                        "priced_ms_per_step": sum(r["priced"] for r in rows) / len(rows) * 1e3,
                        "tokens_per_s": tokens / seconds,
                        "expected_tokens": sum(expected) / len(expected) if expected else None,
                        "nodes": sorted({r["nodes"] for r in rows})}
    return report


if __name__ == "__main__":
    main()
