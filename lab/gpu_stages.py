"""The stages of a GPU window after its checks: data, train, eval, bench; and the log and summary they write.

Data is regenerated in this process, in slices, through `blockdraft data` (a larger --count with the same seed
resumes the folder and adds the next prompts of the same seeded order), until the next slice would pass the
data budget. Train, eval and bench run as `python -m blockdraft.cli ...` subprocesses, each under a timeout, so
that one stage that hangs or crashes leaves time and memory to the next. Everything printed goes to stdout and
to one log file; `Summary` rewrites summary.json after every stage, so a window cut short still says how far
it came.
"""

from __future__ import annotations

import gc
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from time import monotonic

from gpu_geometry import Geometry


class Log:
    """Stdout and the log file at once; `run` streams a subprocess's output into both."""

    def __init__(self, path: Path, echo: bool = True) -> None:
        self.file = open(path, "a", encoding="utf-8", buffering=1)
        self.started = monotonic()
        self.encoding = "utf-8"
        self.echo = echo  # False: the file only (a command run beside the main one)

    def write(self, text: str) -> int:
        if self.echo:
            sys.__stdout__.write(text)
            sys.__stdout__.flush()
        self.file.write(text)
        return len(text)

    def flush(self) -> None:
        self.file.flush()

    def isatty(self) -> bool:
        return False

    def line(self, text: str) -> None:
        self.write(f"[{monotonic() - self.started:6.1f} s] {text}\n")

    @contextmanager
    def captured(self):
        """What this process prints (rich progress, warnings, tracebacks) goes to the log too."""
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = self
        try:
            yield
        finally:
            sys.stdout, sys.stderr = saved

    def run(self, command: list[str], timeout: float) -> Ran:
        """Run `command`, its output into the log, killed (its whole process group) after `timeout` seconds."""
        self.line("$ " + shlex.join(command) + f"   (timeout {timeout:.0f} s)")
        started = monotonic()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   errors="replace", start_new_session=True)
        last_json: list[dict] = []
        reader = threading.Thread(target=self._copy, args=(process.stdout, last_json), daemon=True)
        reader.start()
        timed_out = False
        try:
            process.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            timed_out = True
            self.line(f"timeout after {timeout:.0f} s: stopping {command[3] if len(command) > 3 else command[0]}")
            _stop(process)
        reader.join(timeout=10)
        ran = Ran(process.returncode, round(monotonic() - started, 1), timed_out, last_json[-1] if last_json else None)
        self.line(f"exit {ran.rc} after {ran.seconds} s")
        return ran

    def _copy(self, stream, last_json: list[dict]) -> None:
        for text in stream:
            self.write(text)
            if text.startswith("{"):
                try:
                    last_json.append(json.loads(text))
                except json.JSONDecodeError:
                    pass


class Beside:
    """A command run in a thread beside the main stage's (the second geometry's training or eval), its output in a
    log file of its own; `join` gives its Ran, or None if it has not ended."""

    def __init__(self, command: list[str], path: Path, timeout: float) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.log, self.ran = Log(path, echo=False), None
        self.thread = threading.Thread(target=self._run, args=(command, timeout), daemon=True)
        self.thread.start()

    def _run(self, command: list[str], timeout: float) -> None:
        self.ran = self.log.run(command, timeout)

    def join(self, timeout: float) -> Ran | None:
        self.thread.join(max(0.0, timeout))
        return self.ran


@dataclass
class Ran:
    rc: int
    seconds: float
    timed_out: bool
    record: dict | None  # the last JSON line the command printed (the commands end with one)

    def as_dict(self) -> dict:
        return {"rc": self.rc, "seconds": self.seconds, "timed_out": self.timed_out}


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to the group, then SIGKILL if it is still there 10 s later."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


class Summary:
    """summary.json, rewritten whole (temporary file, rename) after every change."""

    def __init__(self, path: Path, **fields) -> None:
        self.path = path
        self.data = {"status": "running", **fields}
        self.save()

    def set(self, **fields) -> None:
        self.data.update(fields)
        self.save()

    def save(self) -> None:
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps(self.data, indent=2, default=str) + "\n", encoding="utf-8")
        os.replace(partial, self.path)


def cli(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "blockdraft.cli", *arguments]


def free_gpu_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def generate_data(args, log: Log, budget: float) -> dict:
    """`blockdraft data` in slices of args.data_slice prompts, while the next slice fits the budget (a slice is
    expected to take as long as the last one; the first always runs). A slice that fails ends the stage; the
    shards written before it stay (they are written whole) and are trained on."""
    from blockdraft.cli import main as blockdraft

    folder = args.work / "data"
    sets = [str(p) for p in sorted((args.prompts_dir / "train").glob("*.jsonl"))]
    if not sets:
        raise FileNotFoundError(f"no training prompt extracts in {args.prompts_dir / 'train'}; run "
                                "`lab/gpu_train.sh prep` and carry its folder")
    sets += [] if args.no_magpie else ["magpie"]  # prompts the target writes itself (docs/data.md)
    started, slices, examples, error = monotonic(), [], 0, None
    while True:
        count = (len(slices) + 1) * args.data_slice
        began = monotonic()
        try:
            rc = blockdraft(["data", "--out", str(folder), "--sets", ",".join(sets), "--count", str(count),
                             "--batch-size", str(args.data_batch_size), "--device", args.device,
                             "--max-new-tokens", str(args.data_max_new_tokens), *threads(args), *answers(args),
                             *shlex.split(args.data_extra)])
        except Exception as failure:  # a CUDA out-of-memory, say: the shards so far are whole
            log.write(traceback.format_exc())
            rc = f"{type(failure).__name__}: {failure}"
        if rc != 0:
            error = f"blockdraft data --count {count} failed: {rc if isinstance(rc, str) else f'exit {rc}'}"
            break
        seconds = monotonic() - began
        now = _count(folder)
        slices.append({"prompts": count, "examples": now, "seconds": round(seconds, 1)})
        log.line(f"data: {now} examples after {monotonic() - started:.0f} s of {budget:.0f}")
        if now == examples:  # the prompt extracts are used up
            break
        examples = now
        if monotonic() - started + seconds > budget:
            break
    examples = _count(folder)
    return {"folder": str(folder), "examples": examples, "slices": slices, "seconds": round(monotonic() - started, 1),
            **({"error": error} if error else {})}


def answers(args) -> list[str]:
    """Greedy answers: the carried data folders' prompts are not regenerated (their greedy answers are held), so the
    window adds only prompts they lack. Sampled answers (--data-answers > 1): every prompt, carried ones too."""
    if args.data_answers > 1:
        return ["--answers", str(args.data_answers), "--temperature", str(args.data_temperature)]
    return ["--skip-held", ",".join(str(folder) for folder in args.data_in)] if args.data_in else []


def _count(folder: Path) -> int:
    from blockdraft.train.data import read_examples

    return len(read_examples(folder)) if any(folder.glob("data-*")) else 0


def train_command(args, data_dirs: list[Path], geometry: Geometry, run_dir: Path, draft_dir: Path) -> list[str]:
    options = ["--layers", str(geometry.layers), "--block-size", str(geometry.block_size),
               "--target-layer-ids", ",".join(str(i) for i in geometry.layer_ids)]
    if args.gamma is not None:
        options += ["--gamma", str(args.gamma)]
    data = [a for folder in data_dirs for a in ("--data", str(folder))]
    return cli("train", *data, "--out", str(run_dir), "--draft-out", str(draft_dir), *options,
               "--batch-size", str(args.batch_size), "--micro-batch-size", str(args.micro_batch_size),
               "--epochs", str(args.epochs), "--time-budget", str(args.train_seconds),
               "--save-draft-every-seconds", str(args.draft_every), "--device", args.device, *threads(args),
               *shlex.split(args.train_extra))


def eval_command(args, draft_dir: Path) -> list[str]:
    prompts = ",".join(str(prompt_file(args, name)) for name in args.eval_sets.split(","))
    return cli("eval", "--draft", str(draft_dir), "--prompts", prompts, "--limit", str(args.eval_limit),
               "--max-new-tokens", str(args.eval_max_new_tokens), "--batch-size", str(args.eval_batch_size),
               "--block-size", str(args.eval_block_size), "--device", args.device, *threads(args))


def pack_data(folder: Path, path: Path, limit: int) -> dict:
    """The data folder as one tar file (a call returns files, not folders): its metadata and as many whole
    shards, in order, as keep the file under `limit` bytes."""
    import tarfile

    files = sorted(p for p in folder.iterdir() if p.is_file())
    shards = [p for p in files if p.name.startswith("data-")]
    chosen = [p for p in files if p not in shards]
    size = sum(p.stat().st_size for p in chosen) + 1024 * (len(files) + 20)  # headers and the end blocks
    for shard in shards:
        if size + shard.stat().st_size + 1024 > limit:
            break
        chosen.append(shard)
        size += shard.stat().st_size + 1024
    with tarfile.open(path, "w") as tar:
        for file in chosen:
            tar.add(file, arcname=f"{folder.name}/{file.name}")
    kept = [p.name for p in chosen if p in shards]
    return {"file": path.name, "bytes": path.stat().st_size, "shards": len(kept), "of_shards": len(shards)}


def bench_command(args, batch_size: int, prompts: int) -> list[str]:
    return cli("bench", "--prompts", str(prompt_file(args, args.bench_set)), "--limit", str(prompts),
               "--batch-size", str(batch_size), "--methods", args.bench_methods,
               "--max-new-tokens", str(args.bench_max_new_tokens), "--draft", str(args.out / "draft"),
               "--out", str(args.work / f"bench-b{batch_size}"), "--device", args.device, *threads(args))


def prompt_file(args, name: str) -> Path:
    """A benchmark set's extract in the prompts folder (eval/NAME.jsonl), or a path as given."""
    extract = args.prompts_dir / "eval" / f"{name}.jsonl"
    return extract if extract.is_file() else Path(name)


def threads(args) -> list[str]:
    return ["--threads", str(args.threads)] if args.threads else []


def recover_draft(folder: Path) -> None:
    """Leave `folder` whole after a kill in the trainer's swap (folder -> .old, .partial -> folder): a complete
    .partial (config.json is written last) or the .old one takes its place; the leftovers go (they would come
    back with the draft and crowd out its files)."""
    partial, old = folder.with_name(folder.name + ".partial"), folder.with_name(folder.name + ".old")
    if not (folder / "config.json").is_file():
        for candidate in (partial, old):
            if (candidate / "config.json").is_file():
                shutil.rmtree(folder, ignore_errors=True)
                candidate.rename(folder)
                break
    for leftover in (partial, old):
        shutil.rmtree(leftover, ignore_errors=True)


def train_metrics(run_folder: Path) -> list[dict]:
    """The run's metrics.jsonl records (a line cut by a kill is dropped)."""
    path = run_folder / "metrics.jsonl"
    records = []
    for text in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        try:
            records.append(json.loads(text))
        except json.JSONDecodeError:
            continue
    return records


def tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a log file ("" when there is none)."""
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]) if path.is_file() else ""


def returned_files(out: Path) -> list[dict]:
    """What the call brings back: every file under `out`, with its size."""
    return [{"path": str(p.relative_to(out)), "bytes": p.stat().st_size}
            for p in sorted(out.rglob("*")) if p.is_file()]
