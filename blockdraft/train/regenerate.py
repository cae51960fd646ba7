"""`blockdraft data`: regenerate every training response with the target (batched, with progress).

Resumable: a folder that already holds shards of the same settings keeps them; the prompts they cover are
skipped and new shards continue the numbering. A larger `count` with the same seed selects a superset of
the prompts (the seeded order is fixed), so a stopped run can be resumed and a finished one grown.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ..decode.decoder import Decoder
from ..prompts import training_prompts
from ..errors import InputError
from .data import make_example, read_examples, select_prompts, write_atomically, write_shard


def build_dataset(target, out: str | Path, *, sets, count: int, max_prompt_tokens: int = 384,
                  max_new_tokens: int = 256, batch_size: int = 32, shard_size: int = 512, seed: int = 0) -> dict:
    """Write data-*.jsonl shards and meta.json under `out`; returns the meta record."""
    for name, value in (("count", count), ("batch_size", batch_size), ("shard_size", shard_size),
                        ("max_prompt_tokens", max_prompt_tokens), ("max_new_tokens", max_new_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"`{name}` must be a whole number >= 1, got {value!r}; "
                             f"pass --{name.replace('_', '-')} 1 or more")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {"target": target.name, "sets": list(sets), "max_prompt_tokens": max_prompt_tokens,
                "max_new_tokens": max_new_tokens, "seed": seed}
    done, shard, tokens, empty_ids = _resume_point(out, settings)
    prompts = training_prompts(tuple(sets))
    chosen, skipped = select_prompts(prompts, target.tokenizer, count=count,
                                     max_prompt_tokens=max_prompt_tokens, seed=seed)
    skipped.update(empty_response=len(empty_ids))
    chosen = [item for item in chosen if item[0] not in done and item[0] not in empty_ids]
    chosen.sort(key=lambda item: len(item[1]))  # similar lengths share a batch: less padding
    examples, first_shard = [], shard
    columns = [TextColumn("regenerating"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[tok]} tok"),
               TimeRemainingColumn()]
    with Progress(*columns) as progress:
        task = progress.add_task("data", total=len(chosen), tok=0)
        for start in range(0, len(chosen), batch_size):
            batch = chosen[start: start + batch_size]
            results = Decoder(target, None).generate([ids for _, ids in batch], max_new_tokens=max_new_tokens)
            for (example_id, ids), result in zip(batch, results):
                if not result.tokens or (result.finish_reason == "stop" and len(result.tokens) == 1):
                    empty_ids.add(example_id)  # nothing but the stop token: no block to learn from
                    skipped["empty_response"] = len(empty_ids)
                    continue
                examples.append(make_example(example_id, ids, result.tokens))
                tokens += len(result.tokens)
            while len(examples) >= shard_size:
                write_shard(out / f"data-{shard:05d}.jsonl", examples[:shard_size])
                examples, shard = examples[shard_size:], shard + 1
                # Keep meta.json current: a run stopped early still leaves a described, usable folder.
                _write_meta(out, target, sets, count, skipped, tokens, len(done) + (shard - first_shard) * shard_size,
                            max_prompt_tokens, max_new_tokens, seed, complete=False, empty_ids=empty_ids)
            progress.update(task, advance=len(batch), tok=tokens)
    if examples:
        write_shard(out / f"data-{shard:05d}.jsonl", examples)
    written = len(done) + (shard - first_shard) * shard_size + len(examples)
    return _write_meta(out, target, sets, count, skipped, tokens, written, max_prompt_tokens, max_new_tokens, seed,
                       complete=True, empty_ids=empty_ids)


def _resume_point(out: Path, settings: dict) -> tuple[set[str], int, int, set[str]]:
    """(ids already written, shards there, their response tokens, ids whose response was empty) of `out`.

    Shards written with other settings are refused: mixing them would make one data set of two recipes. Prompts
    whose response came back empty are not regenerated (greedy decoding would give the same empty answer).
    """
    shards = sorted(out.glob("data-*.jsonl"))
    if not shards:
        return set(), 0, 0, set()
    meta_file = out / "meta.json"
    try:
        meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
    except json.JSONDecodeError as error:
        raise InputError(f"{meta_file} is not valid JSON ({error.msg}); it records the folder's settings: "
                         "restore it, or write to a new --out folder") from error
    changed = sorted(key for key, value in settings.items() if meta.get(key) != value)
    if changed:
        raise InputError(f"{out} already holds shards built with other settings "
                         f"({ {key: meta.get(key) for key in changed} }, now { {k: settings[k] for k in changed} }); "
                         "resume with the same settings, or write to a new --out folder")
    examples = read_examples(out)
    tokens = sum(sum(example.loss_mask) for example in examples)
    return {example.id for example in examples}, len(shards), tokens, set(meta.get("empty_response_ids", []))


def _write_meta(out, target, sets, count, skipped, tokens, examples, max_prompt_tokens, max_new_tokens, seed,
                complete: bool, empty_ids: set[str]) -> dict:
    meta = {
        "target": target.name, "sets": list(sets), "prompts_requested": count, "examples": examples,
        "response_tokens": tokens, "skipped": skipped, "complete": complete,
        "decoding": "greedy (the target's own argmax)", "chat_template": "target tokenizer's, add_generation_prompt=True",
        "max_prompt_tokens": max_prompt_tokens, "max_new_tokens": max_new_tokens, "seed": seed,
        "empty_response_ids": sorted(empty_ids),
    }
    write_atomically(out / "meta.json", json.dumps(meta, indent=2))
    return meta
