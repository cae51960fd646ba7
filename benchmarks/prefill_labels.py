"""Data without generation: how many draft labels a prefill of human-written answers gives per CPU-minute, against
regenerating the answers with the target.

    python benchmarks/prefill_labels.py [--pairs 64] [--max-answer-tokens 256] [--block-size 8] [--batch-size 8]
                                        [--regen-batch-size 64]

A prefill of (prompt, human answer) gives the target's greedy token g_t after every answer position t at once. A
block anchored at answer position p may supervise slot k with g_{p+k-1} only where the human text followed the
target's greedy path for the k-1 tokens before it (x_{p+j} = g_{p+j-1}, j = 1..k-1): then the label is exactly what
the target would have written (slot 1 always qualifies). A regenerated answer is the greedy path itself, so every
slot of every anchor qualifies, but each of its tokens costs a decode step.

The pairs are ShareGPT chats' answers as the file has them (`sharegpt-turns`, a training set: the answer to turn t
is the assistant message before turn t+1). Both arms run on the same prompts, the same target and threads, in one
process: the prefill over prompt + answer (batched), and greedy regeneration of up to as many answer tokens
(`Decoder(target, None)`, as `blockdraft data` does). Printed: positions and labelled slots per CPU-minute, the
share of slot k labelled, and the labels weighted as the loss weights them (exp(-(k-1)/gamma), gamma 4 at K=8).
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch


def labelled_slots(tokens: list[int], greedy: list[int], block_size: int) -> list[int]:
    """Counts [K-1]: for slot k = 1..K-1, the anchors p of `tokens` whose slot k has a label on the greedy path.
    greedy[t] is the target's argmax after tokens[:t+1]; slot k of anchor p is labelled g_{p+k-1} when
    tokens[p+j] == greedy[p+j-1] for j = 1..k-1, and needs p+k-1 within the text."""
    n = len(tokens)
    agree = [tokens[t + 1] == greedy[t] for t in range(n - 1)]  # agree[t]: the text took g_t at t+1
    counts = [0] * (block_size - 1)
    for p in range(n):
        for k in range(1, block_size):
            if p + k - 1 >= n:  # g_{p+k-1} needs the position p+k-1 in the text
                break
            counts[k - 1] += 1
            if p + k - 1 >= n - 1 or not agree[p + k - 1]:  # the next slot needs the text on the path here
                break
    return counts


def human_pairs(count: int, max_answer_tokens: int, target) -> list[tuple[list[int], list[int]]]:
    """(prompt ids with the generation prompt, answer ids) of `count` ShareGPT turns with a human-written answer."""
    from blockdraft.api import encode
    from blockdraft.prompts import load_prompts

    pairs = []
    for prompt in load_prompts("sharegpt-turns"):
        messages = list(prompt.messages)
        if len(messages) < 3 or messages[-2]["role"] != "assistant":
            continue  # a first turn: no earlier answer in its context
        context, answer = messages[:-2], messages[-2]["content"]
        prompt_ids = encode(target, context)
        answer_ids = target.tokenizer(answer, add_special_tokens=False)["input_ids"][:max_answer_tokens]
        if len(prompt_ids) > 384 or len(answer_ids) < 16:
            continue  # `blockdraft data`'s default prompt bound; too short an answer says little
        pairs.append((prompt_ids, answer_ids))
        if len(pairs) == count:
            break
    return pairs


@torch.inference_mode()
def prefill_greedy(target, pairs, batch_size: int) -> tuple[list[list[int]], float]:
    """Per pair, the target's greedy token after each answer position, from one prefill of prompt + answer; and the
    seconds it took."""
    out: list[list[int]] = []
    start = time.perf_counter()
    for first in range(0, len(pairs), batch_size):
        chunk = pairs[first: first + batch_size]
        rows = [p + a for p, a in chunk]
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])  # [B, T] right-padded
        positions = torch.arange(width).expand_as(ids)
        cache = target.new_cache(len(rows), width)
        # Logits at each answer position t (predicting t+1), rows right-padded: R = the longest answer.
        answer_len = max(len(a) for _, a in chunk)
        logit_rows = torch.stack([torch.arange(answer_len) + len(p) for p, _ in chunk]).clamp(max=width - 1)
        logits = target.forward(ids, positions, cache, (), logit_rows=logit_rows).logits  # [B, R, V]
        greedy = logits.argmax(-1)
        out += [greedy[i, : len(a)].tolist() for i, (_, a) in enumerate(chunk)]
    return out, time.perf_counter() - start


def regenerate(target, pairs, batch_size: int) -> tuple[list[int], float]:
    """Greedy answers of up to each human answer's length (as `blockdraft data` regenerates): their lengths, and
    the seconds."""
    from blockdraft.decode.decoder import Decoder

    decoder, lengths = Decoder(target, None), []
    start = time.perf_counter()
    for first in range(0, len(pairs), batch_size):
        chunk = pairs[first: first + batch_size]
        results = decoder.generate([p for p, _ in chunk], max_new_tokens=[len(a) for _, a in chunk])
        lengths += [len(r.tokens) for r in results]
    return lengths, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=64)
    parser.add_argument("--max-answer-tokens", type=int, default=256)
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--gamma", type=float, default=4.0)
    parser.add_argument("--batch-size", type=int, default=8, help="prefill rows at a time")
    parser.add_argument("--regen-batch-size", type=int, default=64, help="rows regenerated at a time (`blockdraft "
                        "data --batch-size`, as the shipped data was made)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from blockdraft.hardware import describe
    from blockdraft.io.targets import load_target

    target = load_target()  # as `blockdraft data` loads it
    pairs = human_pairs(args.pairs, args.max_answer_tokens, target)
    K = args.block_size
    weights = [math.exp(-(k - 1) / args.gamma) for k in range(1, K)]
    prefill_greedy(target, pairs[:1], 1)  # warm-up
    greedy, prefill_s = prefill_greedy(target, pairs, args.batch_size)
    counts = [0] * (K - 1)
    for (_, answer), g in zip(pairs, greedy):
        counts = [c + n for c, n in zip(counts, labelled_slots(answer, g, K))]
    positions = sum(len(a) for _, a in pairs)
    lengths, regen_s = regenerate(target, pairs, args.regen_batch_size)
    regen_tokens = sum(lengths)
    # A regenerated answer is the greedy path: slot k of anchor p is labelled x_{p+k} wherever p+k is in the answer.
    regen_counts = [sum(max(0, n - k) for n in lengths) for k in range(1, K)]
    per_min = lambda n, s: n / s * 60  # noqa: E731
    weighted = lambda c: sum(w * n for w, n in zip(weights, c))  # noqa: E731
    print(f"{describe()}, torch {torch.__version__}, {args.threads} threads; target {target.name} "
          f"({str(target.dtype).removeprefix('torch.')}{', int4 layers' if target.quantized else ''}); "
          f"{len(pairs)} ShareGPT answers, {positions} answer tokens, K={K}, gamma {args.gamma:g}; prefill batch "
          f"{args.batch_size}, regeneration batch {args.regen_batch_size}")
    print(f"prefill of the human answers: {prefill_s:.1f} s, {per_min(positions, prefill_s):,.0f} positions/min; "
          f"labelled slots 1..{K - 1}: {counts} (share {[round(c / positions, 3) for c in counts]})")
    print(f"regeneration: {regen_s:.1f} s, {regen_tokens} tokens, {per_min(regen_tokens, regen_s):,.0f} tokens/min "
          f"(labelled slots {regen_counts})")
    ratio = per_min(weighted(counts), prefill_s) / per_min(weighted(regen_counts), regen_s)
    print(f"loss-weighted labels per CPU-minute: prefill {per_min(weighted(counts), prefill_s):,.0f}, "
          f"regeneration {per_min(weighted(regen_counts), regen_s):,.0f}: prefill gives {ratio:.2f}x; slot 1 alone "
          f"{per_min(counts[0], prefill_s) / per_min(regen_tokens, regen_s):.2f}x")
    print(json.dumps({"bench": "prefill_labels", "hardware": describe(), "threads": args.threads,
                      "target_dtype": str(target.dtype), "int4": bool(target.quantized), "pairs": len(pairs),
                      "answer_tokens": positions, "block_size": K, "gamma": args.gamma,
                      "prefill_seconds": round(prefill_s, 2), "labelled_slots": counts,
                      "regen_seconds": round(regen_s, 2), "regen_tokens": regen_tokens, "regen_slots": regen_counts,
                      "weighted_labels_per_min": {"prefill": round(per_min(weighted(counts), prefill_s)),
                                                  "regeneration": round(per_min(weighted(regen_counts), regen_s))},
                      "prefill_over_regeneration": round(ratio, 3)}))


if __name__ == "__main__":
    main()
