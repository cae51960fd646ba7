"""llama.cpp's server as a decoder for the bench (external.py `llama-cpp-server`, `llama-cpp-dflash`): one process,
with llama.cpp's own DFlash (`--spec-type draft-dflash`) or without a draft, the plain decode its text must equal.

llama-cpp-python's Python API has no DFlash drafting (it lives in llama.cpp's `common/speculative.cpp`), so the
methods drive llama.cpp's server binary, built from the same sdist (benchmarks/README.md, "llama.cpp's DFlash").
One server per method runs on a free loopback port for the whole bench, so no timing pays a model load; each
prompt is one `/completion` request with our token ids in and the target's token ids out (`return_tokens`),
greedy, prompt cache off, on as many threads as torch. The plain server is the reference, not `llama-cpp`: with
its own defaults (flash attention among them) the server rounds some near-ties otherwise than llama-cpp-python.

Acceptance comes from the server's log: one "accepted A/N draft tokens" line per verify step that drafted
(`server-context.cpp`, written when $LLAMA_TRACE is set), checked against the `draft_n_accepted` total of the response. Steps that drafted nothing
are plain steps of tau 1. The binary: $BLOCKDRAFT_LLAMA_SERVER, else `llama-server` on the PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from ..metrics import AcceptanceStats

SERVER_ENV = "BLOCKDRAFT_LLAMA_SERVER"
START_TIMEOUT_S = 120.0
ACCEPTED = re.compile(r"accepted\s+(\d+)/\s*(\d+) draft tokens")


def find_llama_server() -> Path | None:
    """The llama-server binary to run, or None where there is none."""
    named = os.environ.get(SERVER_ENV)
    if named:
        return Path(named) if Path(named).is_file() else None
    found = shutil.which("llama-server")
    return Path(found) if found else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LlamaServer:
    """One llama-server process on loopback (target GGUF; with a DFlash draft GGUF, its draft length), stopped by
    `close`."""

    def __init__(self, binary: Path, target_gguf: Path, draft_gguf: Path | None, draft_max: int | None,
                 threads: int, context: int) -> None:
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)
        command = [str(binary), "-m", str(target_gguf), "-t", str(threads), "-tb", str(threads), "-c", str(context),
                   "-np", "1", "--host", "127.0.0.1", "--port", str(self.port)]
        if draft_gguf is not None:
            command += ["-md", str(draft_gguf), "--spec-type", "draft-dflash", "--spec-draft-n-max", str(draft_max),
                        "-td", str(threads)]
        # LLAMA_TRACE=1 makes the server log one "accepted A/N draft tokens" line per verify step (and nothing else).
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT,
                                        env={**os.environ, "LLAMA_TRACE": "1"})
        self.url = f"http://127.0.0.1:{self.port}"
        self._wait_ready()

    def _wait_ready(self) -> None:
        import httpx

        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.process.returncode}: {self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.close()
        raise RuntimeError(f"llama-server did not answer /health within {START_TIMEOUT_S:.0f} s: {self.log_tail()}")

    def log_size(self) -> int:
        return Path(self.log.name).stat().st_size

    def log_since(self, offset: int) -> str:
        with open(self.log.name, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace")

    def log_tail(self, chars: int = 600) -> str:
        return self.log_since(max(0, self.log_size() - chars)).strip()

    def complete(self, prompt: list[int], max_new_tokens: int) -> tuple[list[int], dict, str]:
        """Greedy completion of `prompt` (token ids): (new token ids, the response's timings, the log lines)."""
        import httpx

        offset = self.log_size()
        body = {"prompt": prompt, "n_predict": max_new_tokens, "temperature": 0.0, "top_k": 1,
                "cache_prompt": False, "return_tokens": True, "stream": False}
        response = httpx.post(f"{self.url}/completion", json=body, timeout=600.0)
        response.raise_for_status()
        data = response.json()
        # The log is written after the response is sent: give the last step's line a moment to land.
        time.sleep(0.01)
        return [int(t) for t in data["tokens"]], data.get("timings", {}), self.log_since(offset)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)


def step_stats(log: str, new_tokens: int, draft_max: int, accepted_total: int | None) -> AcceptanceStats | None:
    """Acceptance of one completion from the server's per-step lines; None when they do not add up to the
    response's own `draft_n_accepted` (another llama.cpp's log format: no tau rather than a wrong one)."""
    steps = [(int(a), int(n)) for a, n in ACCEPTED.findall(log)]
    if accepted_total is not None and sum(a for a, _ in steps) != accepted_total:
        return None
    stats = AcceptanceStats(draft_max + 1)
    for accepted, drafted in steps:
        stats.record(accepted + 1, width=drafted + 1)
    # The prefill gives the first token; every other token not covered by a drafting step came from a plain one.
    for _ in range(max(0, new_tokens - 1 - stats.tokens)):
        stats.record(1, width=1)
    return stats

