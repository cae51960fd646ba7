"""What a GPU window needs prepared here, once: the target's GGUF in parts and the gguf wheel (`split`), the prompt
extracts it carries (`prep`), the greedy reference it checks the target against (`reference`), the device
calls (`plan`), and a tree light enough to travel (`light`, undone by `restore`). lab/gpu_train.py runs these modes.
"""

from __future__ import annotations

import itertools
import json
import math
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from gpu_check import make_reference

REPO = Path(__file__).resolve().parent.parent


MIB = 2**20
CALL_LIMIT = 64 * MIB  # what one device call may carry, the tracked files included
DATA_ROOM = 12 * MIB  # left free in each call for prompts, data and the wheel
GGUF_WHEEL = "gguf==0.19.0"  # the device has no gguf; transformers reads the target's file with it


def gpu_folders() -> list[Path]:
    """.gpu_1 .. .gpu_N of `split`, in order."""
    return sorted(REPO.glob(".gpu_[0-9]*"), key=lambda p: int(p.name.split("_")[1]))


def split_target(args) -> int:
    """The embedded GGUF cut into parts .gpu_1/part_001 .. .gpu_N/part_00N (the last folder also holds the whole
    file's sha256), N the fewest that leave DATA_ROOM in each call beside the tracked files; and the gguf wheel
    for Python 3.12 in .whl. All of them are kept out of git; each travels only in the call that carries it."""
    from blockdraft.io.targets import embedded_gguf_path, sha256_file

    gguf = embedded_gguf_path()
    size, travelling = gguf.stat().st_size, _travelling_bytes()
    room = CALL_LIMIT - travelling - DATA_ROOM
    if args.parts:  # sized by the caller (a plan without a data stage needs little room): parts must still fit
        count = args.parts
        if travelling + math.ceil(size / count) > CALL_LIMIT:
            print(f"{count} parts of {size / count / MIB:.1f} MiB beside {travelling / MIB:.1f} MiB of tracked files "
                  f"pass the {CALL_LIMIT // MIB} MiB a call may carry: take more parts", file=sys.stderr)
            return 2
    elif room < 4 * MIB:
        print(f"the tracked files leave {room / MIB:.1f} MiB a call: too little for parts of the target; "
              "give --parts for a plan without a data stage", file=sys.stderr)
        return 2
    else:
        count = math.ceil(size / room)
    for old in gpu_folders():
        shutil.rmtree(old)
    step = math.ceil(size / count)
    with open(gguf, "rb") as source:
        for index in range(1, count + 1):
            folder = REPO / f".gpu_{index}"
            folder.mkdir()
            (folder / f"part_{index:03d}").write_bytes(source.read(step))
            _exclude(folder)
    (REPO / f".gpu_{count}" / "sha256").write_text(sha256_file(gguf) + "\n")
    wheels = REPO / ".whl"
    shutil.rmtree(wheels, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
                    "-d", str(wheels), GGUF_WHEEL], check=True)
    _exclude(wheels)
    print(f"{gguf.name}: {count} parts of {step / MIB:.1f} MiB in .gpu_1 .. .gpu_{count}; {GGUF_WHEEL} in .whl")
    return 0


def write_prompts(args) -> int:
    """Training prompts (only those that fit --max-prompt-tokens) and the benchmark sets, as extracts."""
    from blockdraft.io.prompts import encode_prompt
    from blockdraft.io.targets import load_target
    from blockdraft.prompts import DEFAULT_TRAINING_SETS, GENERATED_SETS, extract_jsonl, load_prompts, training_prompts

    tokenizer = load_target(dtype="float32").tokenizer
    for kind in ("train", "eval"):
        shutil.rmtree(args.prompts_dir / kind, ignore_errors=True)
        (args.prompts_dir / kind).mkdir(parents=True)
    names = args.train_sets.split(",") if args.train_sets else [n for n in DEFAULT_TRAINING_SETS
                                                                 if n not in GENERATED_SETS]
    for name in names:
        fits = (p for p in training_prompts((name,))
                if len(encode_prompt(tokenizer, list(p.messages))) <= args.max_prompt_tokens)
        fits = list(itertools.islice(fits, args.per_set))
        extract_jsonl(fits, str(args.prompts_dir / "train" / f"{name}.jsonl"), set_name=name)
    for name in args.eval_sets.split(","):
        extract_jsonl(load_prompts(name), str(args.prompts_dir / "eval" / f"{name}.jsonl"), set_name=name)
    _exclude(args.prompts_dir)
    for file in sorted(args.prompts_dir.rglob("*.jsonl")):
        print(f"{file}: {file.stat().st_size / 2**20:.2f} MiB")
    return 0


def _exclude(folder: Path, whole: bool = False) -> None:
    """Keep `folder` out of git (it travels to the device through `carry`, not as an untracked file): its top
    folder, or the folder itself where `whole`."""
    if not folder.resolve().is_relative_to(REPO.resolve()):
        return
    parts = folder.resolve().relative_to(REPO.resolve()).parts
    line = "/" + "/".join(parts if whole else parts[:1]) + "/"
    exclude = REPO / ".git" / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    lines = exclude.read_text().splitlines() if exclude.is_file() else []
    if line not in lines:
        exclude.write_text("\n".join([*lines, line]) + "\n")


LIGHT_LIST = Path(".git") / "blockdraft-light"  # the folders `light` took out of the index, one a line


def data_folders() -> list[str]:
    """The committed `blockdraft data` folders (datasets/<target>/<name>), as git names them."""
    listed = subprocess.run(["git", "ls-files", "-z", "--", "datasets"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode().split("\0")
    return sorted({"/".join(name.split("/")[:3]) for name in listed if name.count("/") >= 3})


def travel_light(args) -> int:
    """Take the committed data folders the window does not carry (all but --keep) out of git's index and into
    .git/info/exclude, so that what every device call sends fits its 64 MiB: their files stay on disk, and
    `restore` puts them back. Until then git counts them as deleted, so restore before any commit."""
    committed = {(REPO / name).resolve(): name for name in data_folders()}
    keep = {(REPO / folder).resolve() for folder in args.keep}
    drop = [name for path, name in committed.items() if path not in keep]
    missing = [str(folder) for folder in args.keep if (REPO / folder).resolve() not in committed]
    if missing:
        print(f"not a committed data folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    if drop:
        subprocess.run(["git", "rm", "-r", "-q", "--cached", "--", *drop], cwd=REPO, check=True)
        for name in drop:
            _exclude(REPO / name, whole=True)
        listed = REPO / LIGHT_LIST
        old = listed.read_text().splitlines() if listed.is_file() else []
        listed.write_text("\n".join(dict.fromkeys([*old, *drop])) + "\n")
    print(f"out of the index until `gpu_train.sh restore`: {', '.join(drop) or 'nothing'}; "
          f"{_travelling_bytes() / MIB:.1f} MiB travel in every call")
    return 0


def restore(args) -> int:
    """Put back what `light` took out of the index, and its lines of .git/info/exclude."""
    listed = REPO / LIGHT_LIST
    folders = listed.read_text().split() if listed.is_file() else []
    if folders:
        subprocess.run(["git", "reset", "-q", "--", *folders], cwd=REPO, check=True)
        exclude = REPO / ".git" / "info" / "exclude"
        lines = [line for line in exclude.read_text().splitlines() if line.strip("/") not in folders]
        exclude.write_text("".join(f"{line}\n" for line in lines))
    listed.unlink(missing_ok=True)
    print(f"back in the index: {', '.join(folders) or 'nothing'}")
    return 0


def write_reference(args) -> int:
    from blockdraft.io.targets import embedded_gguf_path, load_target, sha256_file

    reference = make_reference(load_target(dtype="float32", device="cpu"), sha256_file(embedded_gguf_path()))
    head = json.dumps({k: v for k, v in reference.items() if k != "prompts"}, indent=1)
    rows = ",\n".join("  " + json.dumps(row) for row in reference["prompts"])  # one line a prompt
    args.reference.write_text(f'{head[:-2]},\n "prompts": [\n{rows}\n ]\n}}\n')
    print(f"wrote {args.reference}")
    return 0


def print_plan(run_options: list[str], options, seconds: float) -> int:
    """The calls, each with its command, carry list and timeout, and what travels in each: `run_options` as
    given, `options` as `run` parses them, `seconds` the job's whole time."""
    folders = gpu_folders()
    if not folders:
        print("no .gpu_N folders: run `lab/gpu_train.sh split` first", file=sys.stderr)
        return 2
    n = len(folders)
    final = (f"bash lab/gpu_train.sh part {n} && bash lab/gpu_train.sh run --out \"$OUT\" "
             + shlex.join(run_options)).strip()  # quoted as given: --train-extra "..." stays one argument
    calls = [(f"bash lab/gpu_train.sh part {i}", [f".gpu_{i}"], 60) for i in range(1, n)]
    calls.append((final, [f".gpu_{n}", ".whl", *[p for p in (".gpudata",) if (REPO / p).is_dir()]],
                  int(seconds + 30)))
    base = _travelling_bytes()
    for number, (command, carry, timeout) in enumerate(calls, 1):
        size = (base + sum(_bytes(REPO / p) for p in carry)) / 2**20
        warning = "  OVER THE 64 MiB LIMIT: `gpu_train.sh light --keep FOLDER ...` first" if size > 64 else ""
        print(f"call {number}: run(command={json.dumps(command)}, carry={json.dumps(carry)}, "
              f"timeout_s={timeout})   # {size:.1f} MiB travel{warning}")
    device = 120 + 30 * (n - 1) + seconds + 30
    print(f"\nthe calls back to back (an idle machine goes back after ~30 s, with its /tmp). Job: {seconds:.0f} s "
          f"(data {options.data_seconds:.0f}, train {options.train_seconds:.0f} + "
          f"{options.train_grace:.0f}, eval {options.eval_seconds:.0f}, bench {options.bench_seconds:.0f}); device "
          f"time about {device / 60:.1f} min with a 2-minute start, of 15. Returned: run.log, summary.json, draft/.")
    return 0


def _travelling_bytes() -> int:
    """Tracked files and untracked files git does not ignore: what every call sends."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.split(b"\0")
    return sum(_bytes(REPO / name.decode()) for name in listed if name)


def _bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0
