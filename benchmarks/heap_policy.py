"""What glibc's heap policy costs a training run: steps, kernel time and anonymous memory (blockdraft/heap.py).

    python benchmarks/heap_policy.py --data datasets/smollm2-135m-instruct/cpu-b --seconds 150 \
        --policies default,mmap,trim,trim8 [--compile off] [--threads 1]

Each policy trains the shipped draft in a fresh process (`blockdraft train --feature-store`, the CPU continuations'
recipe: K = 8, 96 anchors, plain cross-entropy, an 8k head, bf16 autocast where native) for `--seconds` of
training: `default` leaves glibc as it is, `mmap` keeps its mmap threshold at 128 KiB (`MALLOC_MMAP_THRESHOLD_=131072`),
`trimN` gives the heap's free pages back after every N-th optimizer step (`heap.trim`; the trainer's own policy is
`trim8`), `trim` after every one. Printed per policy: optimizer steps, the share of the process's CPU time spent in
the kernel (page faults of fresh mappings), and its anonymous memory sampled every 5 s (first, last, peak). The
data folder needs its feature store (`blockdraft features --data FOLDER --target-layer-ids 1,27`). Ends with one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SHIPPED = "blockdraft/drafts/smollm2-135m-instruct"

# Runs in the child: choose the policy, sample memory in a thread, train, print one JSON line.
CHILD = r"""
import json, os, sys, threading
import blockdraft.heap as heap
import blockdraft.train.trainer as trainer
policy, argv = sys.argv[1], sys.argv[2:]
if policy.startswith("trim"):
    trainer.TRIM_EVERY = int(policy[4:] or 1)
else:
    heap.trim = lambda: False
samples, done = [], threading.Event()
def sample():
    while not done.wait(5.0):
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                samples.append(int(line.split()[1]) / 2**20)
threading.Thread(target=sample, daemon=True).start()
from blockdraft.cli import main
code = main(argv)
done.set()
user, system = os.times()[:2]
steps = [json.loads(line)["step"] for line in open(os.path.join(argv[argv.index("--out") + 1], "metrics.jsonl"))
         if '"train"' in line]
print(json.dumps({"policy": policy, "exit": code, "steps": max(steps, default=0),
                  "system_share": system / (user + system),
                  "anon_gb": [round(samples[0], 2), round(samples[-1], 2), round(max(samples), 2)] if samples else []}))
"""


def train_args(data: str, out: Path, seconds: int, compile_mode: str, threads: int) -> list[str]:
    return ["train", "--data", data, "--out", str(out), "--init-from", SHIPPED, "--layers", "2", "--block-size",
            "8", "--gamma", "4", "--target-layer-ids", "1,27", "--standardize-features", "--head-ids", "8192",
            "--anchors", "96", "--lr", "2e-4", "--batch-size", "8", "--micro-batch-size", "4", "--cpu-autocast",
            "--feature-store", "--compile", compile_mode, "--time-budget", str(seconds), "--save-every", "100000",
            "--eval-every", "100000", "--val-fraction", "0", "--threads", str(threads)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--seconds", type=int, default=150)
    parser.add_argument("--policies", default="default,mmap,trim,trim8")
    parser.add_argument("--compile", default="off", choices=("auto", "on", "off"))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for policy in args.policies.split(","):
            out = Path(scratch) / policy
            argv = train_args(args.data, out, args.seconds, args.compile, args.threads)
            env = dict(os.environ, **({"MALLOC_MMAP_THRESHOLD_": "131072"} if policy == "mmap" else {}))
            done = subprocess.run([sys.executable, "-c", CHILD, policy, *argv], capture_output=True, text=True,
                                  env=env)
            lines = [line for line in done.stdout.splitlines() if line.startswith('{"policy"')]
            if done.returncode != 0 or not lines:
                print(done.stderr[-2000:], file=sys.stderr)
                return 1
            results.append(json.loads(lines[-1]))
            r = results[-1]
            print(f"{policy:8s} steps {r['steps']:4d} in {args.seconds} s  kernel {100 * r['system_share']:4.1f} % "
                  f"of CPU time  anonymous memory first / last / peak {r['anon_gb']} GB", flush=True)
    print(json.dumps({"seconds": args.seconds, "compile": args.compile, "threads": args.threads,
                      "data": args.data, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
