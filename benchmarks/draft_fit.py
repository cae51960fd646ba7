"""Is a draft data-limited or recipe-limited? Its teacher-forced loss and slot accuracy on answers it trained on
against answers it never saw, in one run.

Held-out far below seen: it memorises, more data pays. Both low and close: the recipe or the draft's capacity
limits it, and more of the same data will not move it much.

    python benchmarks/draft_fit.py --seen datasets/smollm2-135m-instruct/cpu-code \\
        --unseen datasets/smollm2-135m-instruct/gpu-a --unseen-prompts humaneval,mt-bench --limit 48

`--seen`: a data folder whose prompts the draft trained on (the target's greedy answers are regenerated the same,
so they are the answers it saw). `--unseen`: a data folder it never trained on; only examples whose id says they
cannot have been in its data are kept (`--unseen-ids`: id prefixes, default later ShareGPT turns and magpie
prompts). `--unseen-prompts`: benchmark sets whose answers the target writes here (greedy, `--max-new-tokens`).
Every set scores an anchor at every answer position with the draft's block size and gamma 4, in the target's float
path (the dtype the draft trained with), over the draft's proposal vocabulary as it trained.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time

import torch


def unseen_examples(folder: str, patterns: list[str], limit: int, tokenizer) -> list:
    from blockdraft.train.data import read_examples

    wanted = [re.compile(p) for p in patterns]
    kept = [e for e in read_examples(folder, tokenizer) if any(p.match(e.id) for p in wanted)]
    return kept[:limit]


def benchmark_examples(target, sets: list[str], limit: int, max_new_tokens: int) -> list:
    """The target's own greedy answers to benchmark prompts, as examples (answer supervised)."""
    from blockdraft.api import encode
    from blockdraft.decode.decoder import Decoder
    from blockdraft.prompts import load_prompts
    from blockdraft.train.data import make_example

    examples = []
    for name in sets:
        prompts = load_prompts(name, limit=limit)
        ids = [encode(target, list(p.messages)) for p in prompts]
        for n, (prompt, result) in enumerate(zip(ids, Decoder(target, None).generate(ids, max_new_tokens=max_new_tokens))):
            examples.append(make_example(f"{name}:{n}", prompt, list(result.tokens)))
    return examples


def score(target, draft, examples: list, gamma: float, max_seq_len: int) -> dict:
    from blockdraft.train.evaluate import evaluate_teacher_forced
    from blockdraft.train.forward import BlockForward, head_weight

    forward = BlockForward(draft.module, target)
    head = head_weight(target, target.dtype)
    metrics = evaluate_teacher_forced(forward, head, examples, gamma=gamma, max_seq_len=max_seq_len,
                                      vocab=draft.vocab)
    summary = metrics.summary()
    return {"examples": len(examples), "loss": summary["loss"], "acc_1": summary["acc"][0],
            "acc": summary["acc"], "tf_tau": summary["tf_tau"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft", default=None, help="draft folder (default: the shipped draft)")
    parser.add_argument("--seen", action="append", default=[], help="data folder the draft trained on")
    parser.add_argument("--unseen", action="append", default=[], help="data folder the draft never trained on")
    parser.add_argument("--unseen-ids", default=r"sharegpt-turns:.*:([2-9]|\d\d+)$,magpie:",
                        help="comma-separated regexes: the ids of --unseen examples that cannot be in its data")
    parser.add_argument("--unseen-prompts", default="humaneval,mt-bench", help="benchmark sets answered here")
    parser.add_argument("--limit", type=int, default=48, help="examples per set")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="answer length for --unseen-prompts")
    parser.add_argument("--max-seq-len", type=int, default=640)
    parser.add_argument("--gamma", type=float, default=4.0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from blockdraft.api import load_draft
    from blockdraft.hardware import describe_line
    from blockdraft.io.targets import load_target
    from blockdraft.train.data import read_examples

    target = load_target(weights=None)  # the float path of --dtype auto: what the draft trained against
    draft = load_draft(args.draft, target)
    sets = {}
    for folder in args.seen:
        sets[f"seen {folder}"] = read_examples(folder, target.tokenizer)[: args.limit]
    for folder in args.unseen:
        sets[f"unseen {folder}"] = unseen_examples(folder, args.unseen_ids.split(","), args.limit, target.tokenizer)
    for name in [s for s in args.unseen_prompts.split(",") if s]:
        sets[f"unseen {name} answers"] = benchmark_examples(target, [name], args.limit, args.max_new_tokens)
    print(f"{describe_line('cpu', target.dtype)}; draft {args.draft or 'shipped'}, K={draft.config.block_size}, "
          f"gamma {args.gamma}, proposal vocabulary {'on' if draft.vocab is not None else 'off'}")
    results = {}
    for name, examples in sets.items():
        start = time.perf_counter()
        results[name] = score(target, draft, examples, args.gamma, args.max_seq_len)
        r = results[name]
        print(f"{name:60s} n={r['examples']:3d} loss {r['loss']:.3f} acc_1 {r['acc_1']:.3f} tf_tau {r['tf_tau']:.3f} "
              f"acc {[round(a, 3) for a in r['acc']]} ({time.perf_counter() - start:.0f} s)", flush=True)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
