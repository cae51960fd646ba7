"""One GPU window: train a DFlash draft for the embedded SmolLM2-135M-Instruct within one 15-minute device lease
(docs/training.md, "One GPU window"). lab/gpu_train.sh runs this file from the repository root.

Here, once:   gpu_train.sh split             (the GGUF in parts: .gpu_1 .. .gpu_N, and the gguf wheel: .whl)
              gpu_train.sh prep              (prompt extracts: .gpudata/prompts/{train,eval}/*.jsonl)
              gpu_train.sh light --keep FOLDER ...   (the data folders not carried leave git's index: the tree
                                             fits a call; `gpu_train.sh restore` after the window)
              gpu_train.sh plan [RUN OPTIONS]   (the device calls: command, carry and timeout of each)
On the device, back to back (an idle machine goes back after ~30 s, with its /tmp):
              gpu_train.sh part I            (calls 1 .. N: copy part I to --parts-dir)
              gpu_train.sh run [RUN OPTIONS] (after `part N`, in the last call: join, check, data, train, eval, bench)
gpu_train.sh reference rewrites lab/gpu_reference.json (greedy tokens, CPU, float32).

`run` writes only under --out ($OUT), which must start empty: run.log, summary.json and draft/ (config.json,
blockdraft_vocab.json, and model.safetensors or model.safetensors.index.json with its shards, each < 16 MiB).
That is at most 8 files, what one call returns; `run` refuses a draft geometry whose folder would need more.
Exit status: 0 a draft came back (summary.json says whether it is the final one), 1 none did, 3 refused.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import traceback
from pathlib import Path
from time import monotonic

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_check import RETURN_LIMIT, Refused, check, check_sha256, install_wheels, join_parts  # noqa: E402
from gpu_geometry import choose, geometries, mean_tau  # noqa: E402
from gpu_options import add_run_arguments, window_seconds  # noqa: E402
from gpu_prep import (REPO, gpu_folders, print_plan, restore, split_target, travel_light, write_prompts,  # noqa: E402
                      write_reference)
from gpu_stages import (Beside, Log, Summary, bench_command, eval_command, free_gpu_memory,  # noqa: E402
                        generate_data, pack_data, recover_draft, returned_files, tail, train_command,
                        train_metrics)

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_train.sh", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    part = sub.add_parser("part", help="copy part I of the GGUF to --parts-dir (device calls 1 .. N)")
    part.add_argument("index", type=int)
    part.add_argument("--parts-dir", type=Path, default=Path("/tmp"))
    split = sub.add_parser("split", help="cut the target's GGUF into the parts the calls carry; fetch the gguf wheel")
    split.add_argument("--parts", type=int, default=None, help="how many (default: the fewest that fit the calls)")
    prep = sub.add_parser("prep", help="write the prompt extracts the window carries")
    prep.add_argument("--prompts-dir", type=Path, default=Path(".gpudata/prompts"))
    prep.add_argument("--train-sets", default=None,
                      help="comma-separated training sets (default: blockdraft data's that have a file)")
    prep.add_argument("--eval-sets", default="humaneval,mt-bench")
    prep.add_argument("--max-prompt-tokens", type=int, default=384, help="as `blockdraft data`: longer ones are cut")
    prep.add_argument("--per-set", type=int, default=None, help="at most this many prompts of each training set")
    reference = sub.add_parser("reference", help="write the greedy reference tokens (CPU, float32)")
    reference.add_argument("--reference", type=Path, default=Path("lab/gpu_reference.json"))
    light = sub.add_parser("light", help="take the data folders the window does not carry out of git's index")
    light.add_argument("--keep", type=Path, action="append", default=[], help="a data folder the window carries")
    sub.add_parser("restore", help="put back what `light` took out of the index")
    sub.add_parser("plan", help="print the device calls; options after it go to `run`")
    run = sub.add_parser("run", help="join, check, data, train, eval, bench (the last device call)",
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_run_arguments(run)
    args, args.run_options = parser.parse_known_args(argv)
    if args.run_options and args.mode != "plan":
        parser.error(f"unrecognized arguments: {' '.join(args.run_options)}")
    os.chdir(REPO)
    if args.mode == "plan":
        options = run.parse_args(["--out", "unused", *args.run_options])
        return print_plan(args.run_options, options, window_seconds(options))
    modes = {"split": split_target, "part": copy_part, "prep": write_prompts, "reference": write_reference,
             "light": travel_light, "restore": restore, "run": run_window}
    return modes[args.mode](args)


def copy_part(args) -> int:
    source = REPO / f".gpu_{args.index}"
    parts = sorted(source.glob("part_*"))
    if not parts:
        print(f"{source} holds no part_*: carry it in this call (carry: [\".gpu_{args.index}\"])", file=sys.stderr)
        return 2
    args.parts_dir.mkdir(parents=True, exist_ok=True)
    for part in parts:
        shutil.copyfile(part, args.parts_dir / part.name)
    held = sorted(args.parts_dir.glob("part_*"))
    print(f"part {args.index}: {args.parts_dir} holds " + ", ".join(f"{p.name} ({p.stat().st_size} B)" for p in held))
    return 0


def run_window(args) -> int:
    if args.out is None:
        print("--out is required where $OUT is not set", file=sys.stderr)
        return 2
    # A draft left from another run would come back as if this one wrote it.
    if args.out.exists() and any(args.out.iterdir()):
        print(f"--out {args.out} is not empty; give an empty or new folder", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.data_in is None and (REPO / ".gpudata" / "data").is_dir():
        args.data_in = [REPO / ".gpudata" / "data"]
    log = Log(args.out / "run.log")
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    summary = Summary(args.out / "summary.json", settings=settings, deadline_seconds=window_seconds(args))
    deadline = monotonic() + window_seconds(args)
    with log.captured():
        try:
            window(args, log, summary, deadline)
        except Refused as error:
            log.line(f"REFUSED: {error}")
            (args.out / "REFUSED.txt").write_text(f"{error}\n")
            summary.set(status="refused", reason=str(error))
            return 3
        except Exception as error:  # recorded, and the draft (if any) still described below
            log.write(traceback.format_exc())
            summary.set(status="failed", reason=f"{type(error).__name__}: {error}")
        return finish(args, log, summary)


def window(args, log: Log, summary: Summary, deadline: float) -> None:
    """1. Setup  2. Checks  3. Data  4. Train  5. Eval  6. Bench."""
    def left() -> float:
        return deadline - monotonic()

    # 1. Setup: the target's file from its parts, the gguf wheel, and where every stage finds them.
    started = monotonic()
    gguf = join_parts(sorted(args.parts_dir.glob("part_*")), args.work / "target.gguf")
    sha_file = args.sha256_file or (gpu_folders()[-1] / "sha256" if gpu_folders() else Path("missing-sha256"))
    sha256 = check_sha256(gguf, sha_file)
    wheels = [] if args.no_install else install_wheels(args.wheel_dir, args.site)
    paths = [*([] if args.no_install else [str(args.site)]), str(REPO), os.environ.get("PYTHONPATH", "")]
    os.environ.update(BLOCKDRAFT_TARGET_GGUF=str(gguf), BLOCKDRAFT_CACHE=str(args.work / "cache"),
                      PYTHONPATH=os.pathsep.join(paths))
    summary.set(setup={"gguf_sha256": sha256, "wheels": wheels, "seconds": round(monotonic() - started, 1)})
    # 2. Checks: the target decodes the reference; the draft's geometry fits the target and the return limit.
    summary.set(check=check(args, log, sha256))
    # 3. Data: regenerated here, and the carried folder; the regenerated folder comes back too where room is left.
    data_dirs, data = [], {}
    later = args.train_seconds + args.train_grace + args.eval_seconds + args.bench_seconds
    budget = min(args.data_seconds, left() - later)
    if budget > 0:
        data = generate_data(args, log, budget)
        data_dirs += [Path(data["folder"])] if data["examples"] else []
        free_gpu_memory()  # the generation's cached KV memory would be held away from training
        if data["examples"] and args.data_returned:
            data["returned"] = pack_data(Path(data["folder"]), args.out / "data.tar", limit=16 * 2**20 - 4096)
    if args.data_in:
        data_dirs += args.data_in
        data["carried"] = [str(folder) for folder in args.data_in]
    summary.set(data=data)
    if not data_dirs:
        raise RuntimeError("no training data: generation gave no examples and no --data-in was carried")
    # 4. Train, with a time budget that leaves eval and bench their time; the second geometry beside the first,
    # on the same data and clock (one GPU: each costs the other some speed, equally).
    seconds = min(args.train_seconds, left() - args.train_grace - args.eval_seconds - args.bench_seconds)
    args.train_seconds = max(seconds, 1.0)
    timeout = min(args.train_seconds + args.train_grace, left())
    first, second = geometries(args)
    second_dir = args.work / "second"
    beside = None
    if second is not None:
        beside = Beside(train_command(args, data_dirs, second, second_dir / "train", second_dir / "draft"),
                        second_dir / "train.log", timeout)
        log.line(f"training the second geometry ({second.name()}) beside the first; its log: {second_dir}/train.log")
    ran = log.run(train_command(args, data_dirs, first, args.work / "train", args.out / "draft"), timeout=timeout)
    recover_draft(args.out / "draft")
    records = train_metrics(args.work / "train")
    summary.set(train={**ran.as_dict(), "geometry": first.name(), "time_budget": args.train_seconds,
                       "final_draft": ran.rc == 0, "steps": max((r["step"] for r in records), default=0),
                       "metrics": records})
    if beside is not None:
        ran_second = beside.join(timeout=left() - args.eval_seconds - args.bench_seconds)
        recover_draft(second_dir / "draft")
        records = train_metrics(second_dir / "train")
        summary.set(second={"geometry": second.name(), **(ran_second.as_dict() if ran_second else {"rc": None}),
                            "final_draft": bool(ran_second and ran_second.rc == 0),
                            "steps": max((r["step"] for r in records), default=0), "metrics": records,
                            "log_tail": tail(second_dir / "train.log")})
    if not (args.out / "draft" / "config.json").is_file():
        return
    # 5. Eval: online tau with the real decode loop, both drafts at once; the second is returned instead of the
    # first when its tau is within --second-margin of the first's (it costs a CPU step less).
    timeout = min(args.eval_seconds, left() - args.bench_seconds)
    if timeout < 5:
        summary.set(eval={"skipped": "no time left"})
        return
    has_second = (second_dir / "draft" / "config.json").is_file()
    beside = Beside(eval_command(args, second_dir / "draft"), second_dir / "eval.log", timeout) if has_second else None
    ran = log.run(eval_command(args, args.out / "draft"), timeout=timeout)
    results = {"first": {**ran.as_dict(), "mean_tau": mean_tau(ran.record),
                         "results": (ran.record or {}).get("results")}}
    if beside is not None:
        ran_second = beside.join(timeout=max(5.0, timeout + 15 - ran.seconds))
        record = ran_second.record if ran_second else None
        results["second"] = {**(ran_second.as_dict() if ran_second else {"rc": None}), "mean_tau": mean_tau(record),
                             "results": (record or {}).get("results"), "log_tail": tail(second_dir / "eval.log")}
        results["returned"] = choose(args, results, second_dir / "draft", log)
    summary.set(eval=results)
    # 6. Bench: the target alone, HF generate and the default mode, at each batch size.
    benches = []
    for batch_size, prompts in args.bench_runs:
        timeout = min(args.bench_seconds / len(args.bench_runs), left())
        if timeout < 5:
            benches.append({"batch_size": batch_size, "skipped": "no time left"})
        else:
            ran = log.run(bench_command(args, batch_size, prompts), timeout=timeout)
            benches.append({"batch_size": batch_size, **ran.as_dict(), "result": ran.record})
        summary.set(bench=benches)


def finish(args, log: Log, summary: Summary) -> int:
    """Say plainly whether a draft came back and which one, and list what the call returns."""
    draft, status = args.out / "draft", summary.data["status"]
    if (draft / "config.json").is_file():
        final = summary.data.get("train", {}).get("final_draft", False)
        summary.set(draft={"returned": True, "final": final, "files": sorted(p.name for p in draft.iterdir()),
                           "written": "at the end of training" if final else
                           f"while training (every {args.draft_every:.0f} s): training did not finish"},
                    status=("done" if final else "partial") if status == "running" else status)
    else:
        why = summary.data.get("reason") or "training wrote none (see train in this file and run.log)"
        summary.set(draft={"returned": False, "why": why}, status="failed")
        log.line(f"NO DRAFT came back: {why}")
    files = returned_files(args.out)
    too_many = len(files) > RETURN_LIMIT or any(f["bytes"] >= 16 * 2**20 for f in files)
    summary.set(returned_files=files, fits_return_limit=not too_many)
    if too_many:
        log.line(f"WARNING: {len(files)} files under {args.out}; a call returns {RETURN_LIMIT} of < 16 MiB")
    log.line(f"status {summary.data['status']}; summary in {args.out / 'summary.json'}")
    return 0 if summary.data["draft"]["returned"] else 1


if __name__ == "__main__":
    sys.exit(main())
