"""`blockdraft data --human-answers`: answers people wrote, labelled by one prefill of the target (docs/data.md §6).

Regenerating an answer costs a decode step a token; a prefill of (prompt, human answer) costs one forward over
all of it and gives the target's greedy token g[t] after every position t at once. An example then holds the
human text x and g; training labels slot k of an anchor p with g[p+k-1] only while the text followed the
target's greedy path before it (objective.block_targets), so every label is what the target would have written.

The answers are the training chats' own: in `sharegpt-turns`, a prompt that ends with [..., assistant, user]
gives the context before that assistant turn and the assistant's answer; `sharegpt-answers` gives each chat's last
answer, which no human turn follows (and so no `sharegpt-turns` prompt carries); `codeio-answers` gives each
`codeio-functions` prompt with its record's own code sample as the answer. Resumable like `blockdraft data`
(regenerate.py): the same settings and seed continue the same draw.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ..errors import InputError
from ..io.prompts import encode_prompt
from ..prompts import training_prompts
from .data import held_prompts, make_example, prompt_key
from .feature_store import store_dir, token_digest, write_store_file
from .regenerate import ShardWriter, check_counts, resume_point, write_meta
from .shards import MAX_SHARD_BYTES, ShardSizer, tokenizer_fingerprint

# The training sets whose chats carry a human answer: before the last turn (sharegpt-turns), or as the last turn
# (sharegpt-answers; codeio-answers, a code sample answering its codeio-functions prompt)
HUMAN_SETS = ("sharegpt-turns", "sharegpt-answers", "codeio-answers")
MIN_ANSWER_TOKENS = 16  # a shorter answer gives few blocks


def human_pairs(prompts, tokenizer, *, count: int, max_prompt_tokens: int, max_answer_tokens: int, seed: int,
                stop_id: int | None, held: set[bytes] = frozenset()) -> tuple[list, dict]:
    """(up to `count` [(id, prompt ids, answer ids)] in a seeded order, skipped counts).

    The answer's text is tokenised on its own (it follows the template's assistant header), cut to
    `max_answer_tokens`; an answer that ends within the bound gets the template's closing `stop_id`, as a
    regenerated one does.
    """
    skipped = {"duplicate": 0, "no_human_answer": 0, "prompt_too_long": 0, "answer_too_short": 0,
               "held_elsewhere": 0}
    order, seen, kept = list(prompts), set(), []
    random.Random(seed).shuffle(order)
    for prompt in order:
        if len(kept) >= count:
            break
        split = human_answer(list(prompt.messages))
        if split is None:
            skipped["no_human_answer"] += 1
            continue
        context, answer = split
        text = json.dumps([context, answer], sort_keys=True)
        if text in seen:
            skipped["duplicate"] += 1
            continue
        seen.add(text)
        prompt_ids = encode_prompt(tokenizer, context)
        answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
        if len(answer_ids) < max_answer_tokens and stop_id is not None:
            answer_ids = answer_ids + [stop_id]
        answer_ids = answer_ids[:max_answer_tokens]
        if len(prompt_ids) > max_prompt_tokens:
            skipped["prompt_too_long"] += 1
        elif len(answer_ids) < MIN_ANSWER_TOKENS:
            skipped["answer_too_short"] += 1
        elif held and prompt_key(prompt_ids) in held:
            skipped["held_elsewhere"] += 1
        else:
            kept.append((f"{prompt.set}:{prompt.id}", prompt_ids, answer_ids))
    return kept, skipped


def human_answer(messages: list[dict]) -> tuple[list[dict], str] | None:
    """(the context, the human answer) of a chat that carries one: [..., assistant] (its last answer) or [...,
    assistant, user] (the answer before the last turn); None otherwise."""
    at = len(messages) - (1 if messages and messages[-1].get("role") == "assistant" else 2)
    if at < 1 or messages[at].get("role") != "assistant" or not messages[at].get("content", "").strip():
        return None
    return messages[:at], messages[at]["content"]


@torch.inference_mode()
def prefill_greedy(target, rows: list[tuple[list[int], list[int]]],
                   tap_layer_ids=()) -> tuple[list[list[int]], list[torch.Tensor] | None]:
    """Per (prompt ids, answer ids) row, g [len(prompt) + len(answer)]: the target's argmax after each position
    of the prompt's last token on (0 before it: no label ever reads those), from one batched forward; and with
    `tap_layer_ids`, each row's tapped features [len, L*D] from the same forward (else None)."""
    sequences = [p + a for p, a in rows]
    width = max(len(s) for s in sequences)
    ids = torch.tensor([s + [0] * (width - len(s)) for s in sequences], device=target.device)  # [B, T]
    positions = torch.arange(width, device=target.device).expand_as(ids)  # [B, T]
    # Logit rows: from each prompt's last token to its answer's last, right-padded by repeating the last.
    span = max(len(a) for _, a in rows) + 1
    starts = torch.tensor([len(p) - 1 for p, _ in rows], device=target.device)
    ends = torch.tensor([len(s) - 1 for s in sequences], device=target.device)
    logit_rows = torch.minimum(starts[:, None] + torch.arange(span, device=target.device), ends[:, None])  # [B, R]
    out = target.forward(ids, positions, target.new_cache(len(rows), width), tuple(tap_layer_ids),
                         logit_rows=logit_rows)
    greedy = out.logits.argmax(-1).tolist()  # [B, R]
    labels = [[0] * (len(p) - 1) + g[: len(a) + 1] for (p, a), g in zip(rows, greedy)]
    if not tap_layer_ids:
        return labels, None
    return labels, [out.features[b, : len(s)].to("cpu").clone() for b, s in enumerate(sequences)]  # [S, L*D] each


def build_human_dataset(target, out: str | Path, *, sets=HUMAN_SETS, count: int, max_prompt_tokens: int = 384,
                        max_answer_tokens: int = 256, batch_size: int = 8, shard_size: int = 2048, seed: int = 0,
                        skip_held=(), max_shard_bytes: int = MAX_SHARD_BYTES, feature_taps=None) -> dict:
    """Write data-*.safetensors shards of human answers with the target's greedy labels, and meta.json, under
    `out`; returns the meta record. `count` counts answers; `batch_size` rows share a prefill. `feature_taps`
    (layer ids): the same prefill also writes each shard's feature store file (feature_store.py), so that
    training needs no `blockdraft features` pass over this folder."""
    check_counts(count=count, batch_size=batch_size, shard_size=shard_size, max_prompt_tokens=max_prompt_tokens,
                 max_new_tokens=max_answer_tokens)  # the answer bound is `blockdraft data --max-new-tokens`
    sets = list(sets)
    if not sets or any(name not in HUMAN_SETS for name in sets):
        raise InputError(f"--human-answers reads the human answers of {list(HUMAN_SETS)}; got --sets {sets}: pass "
                         f"--sets {','.join(HUMAN_SETS)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {"target": target.name, "sets": sets, "max_prompt_tokens": max_prompt_tokens,
                "max_new_tokens": max_answer_tokens, "seed": seed, "magpie": None,
                "sampling": {"labels": "greedy, from one prefill of the human answer"}}
    fingerprint = tokenizer_fingerprint(target.tokenizer)
    done, shard, tokens, _ = resume_point(out, settings, target.tokenizer, fingerprint)
    meta = {**settings, "prompts_requested": count, "format": "data-NNNNN.safetensors",
            "tokenizer_sha256": fingerprint, "decoding": "none: human-written answers, the target's greedy token "
            "after each position as labels (docs/data.md §6)", "chat_template": "target tokenizer's, "
            "add_generation_prompt=True"}
    write_meta(out, meta, len(done), tokens, {}, set(), complete=False)
    features: dict[str, torch.Tensor] = {}  # digest -> [S, L*D] of examples not yet written
    writer = ShardWriter(out, shard, len(done), ShardSizer(shard_size, max_shard_bytes, fingerprint,
                                                           int(target.lm_head.weight.shape[0])),
                         on_write=None if not feature_taps else
                         lambda path, written: _write_features(target, out, path, written, features, feature_taps))
    held = held_prompts(skip_held) if skip_held else frozenset()
    stop_id = target.tokenizer.eos_token_id
    chosen, skipped = human_pairs(training_prompts(tuple(sets), answered=True), target.tokenizer, count=count,
                                  max_prompt_tokens=max_prompt_tokens, max_answer_tokens=max_answer_tokens,
                                  seed=seed, stop_id=stop_id, held=held)
    chosen = sorted((item for item in chosen if item[0] not in done), key=lambda item: len(item[1]) + len(item[2]))
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[note]}"), TimeRemainingColumn()) as progress:
        task = progress.add_task("labelling human answers", total=len(chosen), note=f"{tokens} tok")
        for start in range(0, len(chosen), batch_size):
            batch = chosen[start: start + batch_size]
            greedy, tapped = prefill_greedy(target, [(p, a) for _, p, a in batch], feature_taps or ())
            examples = [make_example(example_id, p, a, g) for (example_id, p, a), g in zip(batch, greedy)]
            if tapped is not None:
                features.update((token_digest(e.input_ids), f) for e, f in zip(examples, tapped))
            tokens += sum(len(a) for _, _, a in batch)
            if writer.add(examples):
                write_meta(out, meta, writer.written, tokens, skipped, set(), complete=False)
            progress.update(task, advance=len(batch), note=f"{tokens} tok")
    writer.close()
    return write_meta(out, meta, writer.written, tokens, skipped, set(), complete=True)


def _write_features(target, out: Path, shard: Path, examples: list, features: dict, taps) -> None:
    """The store file of a just-written token shard, from the features its examples' prefills tapped."""
    folder = store_dir(out, target, taps)
    folder.mkdir(parents=True, exist_ok=True)
    digests = dict.fromkeys(token_digest(e.input_ids) for e in examples)
    tensors = {digest: features.pop(digest) for digest in digests if digest in features}  # a repeat: stored before
    write_store_file(folder, shard, tensors, target, taps)
