"""Load test for `blockdraft serve`: N concurrent streaming clients for T seconds, speculative vs target alone.

    python benchmarks/load.py --concurrency 4 --seconds 30          # starts both servers itself, one at a time
    python benchmarks/load.py --url http://127.0.0.1:8000 --baseline-url http://127.0.0.1:8001

Each run stops at --seconds or --max-requests, whichever comes first. Servers this script starts bind 127.0.0.1
on a free port, run one after the other (so they never share the CPU or GPU), and are stopped at the end; their
logs go to a temporary folder. Requests are greedy chat completions streamed with usage. Reported per server:
errors (the goal is 0), p50/p95 latency to the last byte, p50 time to first token, completion tokens/s and
the server's pooled mean tau since it started; then the throughput ratio, and last one JSON line. Greedy
output is exact, so the two servers should write the same text for each prompt; `same_text` counts how often
they did (bfloat16 rounding can differ between batch shapes, so a few differences there are expected).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import httpx

from blockdraft.hardware import describe_line
from blockdraft.prompts import load_prompts


@dataclass
class Outcome:
    ok: bool
    latency: float = 0.0  # request sent -> [DONE]
    first_token: float = 0.0  # request sent -> first content chunk
    tokens: int = 0  # completion tokens, from the usage chunk
    text: str = ""
    error: str = ""


@dataclass
class RunReport:
    label: str
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0
    mean_tau: float | None = None
    texts: dict[int, str] = field(default_factory=dict)  # prompt index -> first text written for it

    def summary(self) -> dict:
        good = [o for o in self.outcomes if o.ok]
        latencies = sorted(o.latency for o in good)
        tokens = sum(o.tokens for o in good)
        rate = round(tokens / self.seconds, 3) if self.seconds else 0.0
        return {"requests": len(self.outcomes), "errors": len(self.outcomes) - len(good),
                "p50_latency_s": _quantile(latencies, 0.5), "p95_latency_s": _quantile(latencies, 0.95),
                "p50_first_token_s": _quantile(sorted(o.first_token for o in good), 0.5),
                "completion_tokens": tokens, "tokens_per_second": rate,
                "mean_tau": self.mean_tau, "first_errors": [o.error for o in self.outcomes if not o.ok][:3]}


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, int(q * len(values)))], 4)


def main(argv=None) -> int:
    args = parse_args(argv)
    prompts = [p.messages for p in load_prompts(args.prompts, args.limit)]
    if not prompts:
        raise SystemExit(f"--prompts {args.prompts!r} gave no prompts; pass a benchmark set or a prompt file")
    settings = {"concurrency": args.concurrency, "seconds": args.seconds, "max_requests": args.max_requests,
                "max_tokens": args.max_tokens, "prompts": args.prompts, "limit": len(prompts),
                "target": args.target or "embedded", "dtype": args.dtype, "hardware": describe_line(args.device)}
    print("settings: " + ", ".join(f"{k} {v}" for k, v in settings.items()), file=sys.stderr)
    runs = [run_server("speculative", args.url, [], args, prompts)]
    if not args.no_baseline:
        runs.append(run_server("target alone", args.baseline_url, ["--no-spec"], args, prompts))
    result = {"settings": settings}
    for run in runs:
        result[run.label] = run.summary()
        print(f"[{run.label}] " + ", ".join(f"{k} {v}" for k, v in run.summary().items()), file=sys.stderr)
    if len(runs) == 2:
        spec, base = (run.summary()["tokens_per_second"] for run in runs)
        result["throughput_ratio"] = round(spec / base, 3) if base else None
        shared = set(runs[0].texts) & set(runs[1].texts)
        result["same_text"] = f"{sum(runs[0].texts[i] == runs[1].texts[i] for i in shared)}/{len(shared)}"
        print(f"throughput ratio {result['throughput_ratio']} (speculative / target alone), "
              f"same text {result['same_text']}", file=sys.stderr)
    print(json.dumps(result))
    return 0 if all(run.summary()["errors"] == 0 for run in runs) else 1


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running speculative server (default: start one)")
    parser.add_argument("--baseline-url", help="a running --no-spec server (default: start one)")
    parser.add_argument("--no-baseline", action="store_true", help="measure the speculative server only")
    parser.add_argument("--api-key", default=os.environ.get("BLOCKDRAFT_API_KEY"), help="for servers given by URL")
    parser.add_argument("--concurrency", type=int, default=4, help="concurrent streaming clients")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long each server is loaded")
    parser.add_argument("--max-requests", type=int, default=200, help="most requests sent to each server")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompts", default="mt-bench", help="a benchmark set or a .jsonl/.txt prompt file")
    parser.add_argument("--limit", type=int, default=20, help="use the first N prompts")
    parser.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to wait for a started server")
    parser.add_argument("--target", default=None, help="for started servers: as in `blockdraft serve`")
    parser.add_argument("--draft", default=None, help="for started servers: as in `blockdraft serve`")
    parser.add_argument("--dtype", default="auto", help="auto (bfloat16 where native, else float32), bfloat16, float32")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    for name in ("concurrency", "seconds", "max_requests", "max_tokens", "limit"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    return args


def run_server(label: str, url: str | None, extra: list[str], args, prompts) -> RunReport:
    """Load one server: the given URL, or one started here on a free loopback port and stopped afterwards."""
    if url is not None:
        return asyncio.run(load(label, url.rstrip("/"), args.api_key, prompts, args))
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="blockdraft-load-") as folder:
        command = [sys.executable, "-m", "blockdraft.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                   "--max-batch", str(args.concurrency), "--dtype", args.dtype, "--device", args.device, *extra]
        command += ["--target", args.target] if args.target else []
        command += ["--draft", args.draft] if args.draft and not extra else []
        env = {k: v for k, v in os.environ.items() if k != "BLOCKDRAFT_API_KEY"}  # a started server has no key
        with open(os.path.join(folder, "server.log"), "w") as log:
            server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
            try:
                wait_healthy(f"http://127.0.0.1:{port}", server, args.startup_timeout, log.name)
                return asyncio.run(load(label, f"http://127.0.0.1:{port}", None, prompts, args))
            finally:
                server.terminate()
                try:
                    server.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()


def free_port() -> int:
    """A port the kernel just handed out on 127.0.0.1 (released before the server binds it: a small race)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_healthy(url: str, server: subprocess.Popen, timeout: float, log_path: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with code {server.returncode}; its log ends:\n"
                             f"{open(log_path).read()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the server at {url} was not healthy within {timeout:.0f} s; raise --startup-timeout")


async def load(label: str, url: str, api_key: str | None, prompts, args) -> RunReport:
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    report = RunReport(label)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=args.seconds + 300) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        await one_request(client, model, prompts[0], 4)  # warm-up: first-call costs stay out of the numbers
        issued = iter(range(args.max_requests))
        start = time.monotonic()
        deadline = start + args.seconds

        async def user() -> None:
            while time.monotonic() < deadline and (n := next(issued, None)) is not None:
                outcome = await one_request(client, model, prompts[n % len(prompts)], args.max_tokens)
                report.outcomes.append(outcome)
                if outcome.ok:
                    report.texts.setdefault(n % len(prompts), outcome.text)

        await asyncio.gather(*(user() for _ in range(args.concurrency)))
        report.seconds = time.monotonic() - start
        report.mean_tau = mean_tau((await client.get("/metrics")).text)
    return report


async def one_request(client: httpx.AsyncClient, model: str, messages, max_tokens: int) -> Outcome:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.monotonic()
    outcome, pieces, done = Outcome(ok=False), [], False
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                outcome.error = f"HTTP {response.status_code}: {(await response.aread())[:300]!r}"
                return outcome
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    outcome.error = chunk["error"]["message"]
                    return outcome
                if chunk.get("usage"):
                    outcome.tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk["choices"]:
                    if choice["delta"].get("content"):
                        outcome.first_token = outcome.first_token or time.monotonic() - start
                        pieces.append(choice["delta"]["content"])
    except (httpx.HTTPError, json.JSONDecodeError) as error:
        outcome.error = f"{type(error).__name__}: {error}"
        return outcome
    outcome.ok, outcome.error = done, "" if done else "the stream ended without data: [DONE]"
    outcome.latency, outcome.text = time.monotonic() - start, "".join(pieces)
    return outcome


def mean_tau(metrics_text: str) -> float | None:
    """Pooled mean tau from the server's Prometheus text: blockdraft_tau_sum / blockdraft_tau_count."""
    values = dict(line.split(" ", 1) for line in metrics_text.splitlines() if line.startswith("blockdraft_tau_"))
    steps = float(values.get("blockdraft_tau_count", 0))
    return round(float(values["blockdraft_tau_sum"]) / steps, 4) if steps else None


if __name__ == "__main__":
    sys.exit(main())
