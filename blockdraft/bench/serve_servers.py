"""`blockdraft serve` processes the load bench starts itself: one per mode, on free loopback ports, stopped after
each round (serve_sweep.py, rule 3).

Servers start one after the other, in an order rotated round by round, each waited for until it is ready
(`ready`: /health answers 200 and every batch size's step costs are measured): a first start on a machine
measures step costs for minutes, and two servers measuring at once would each price their steps with the other's
load. Every server is stopped when the `with` block ends, however it ends (an error, Ctrl-C): SIGTERM, then
SIGKILL if it has not exited within `STOP_SECONDS`. The servers run in sessions of their own, so a Ctrl-C at the
terminal reaches the bench alone, which then stops them in order.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from ..errors import ConfigError
from .runner import interleaved_order

STOP_SECONDS = 30.0  # a drained server exits in a second or two; past this it is killed
SHUTDOWN_GRACE = "1"  # the started servers' --shutdown-grace: nothing of the bench is worth waiting longer for
POLL_SECONDS = 0.5
LOG_TAIL_CHARS = 2000


TARGET_ALONE = "target-alone"  # the reference mode: the target decoding alone
DEFAULT = "default"  # `blockdraft serve` as it runs by default: speculative, adaptive token trees with lookups
MODES = {TARGET_ALONE: ["--no-spec"], DEFAULT: []}  # each mode's own `blockdraft serve` flags


@dataclass(frozen=True)
class Endpoint:
    """A server to load: its mode label (the report's name for it) and base URL."""

    label: str
    url: str


@contextmanager
def started_servers(modes: dict[str, list[str]], serve_args: list[str], log_dir: Path,
                    startup_timeout: float, round_: int = 1) -> Iterator[list[Endpoint]]:
    """Start `blockdraft serve` once per mode (label -> its own flags, e.g. ["--no-spec"]) with `serve_args`, each
    appending to `log_dir/server-<label>.log`; yields their endpoints, in `modes`' order, once all are healthy,
    and stops them all after. Round r starts them in `modes`' order rotated by r - 1 (serve_sweep.py, rule 3)."""
    labels = list(modes)
    with ExitStack() as stack:
        started = {}
        for position, label in enumerate(interleaved_order(labels, round_ - 1), 1):
            header = f"--- round {round_}: started {position} of {len(labels)}\n"
            started[label] = stack.enter_context(server_process(label, [*serve_args, *modes[label]],
                                                                log_dir / f"server-{label}.log", startup_timeout,
                                                                header))
        yield [started[label] for label in labels]


@contextmanager
def server_process(label: str, flags: list[str], log_path: Path, startup_timeout: float,
                   header: str = "") -> Iterator[Endpoint]:
    port = free_port()
    command = serve_command(port, flags)
    env = {k: v for k, v in os.environ.items() if k != "BLOCKDRAFT_API_KEY"}  # a server started here needs no key
    endpoint = Endpoint(label, f"http://127.0.0.1:{port}")
    with open(log_path, "a") as log:
        log.write(header)
        log.flush()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            wait_ready(endpoint, startup_timeout, process, log_path)
            yield endpoint
        finally:
            stop(process)


def serve_command(port: int, flags: list[str]) -> list[str]:
    """`blockdraft serve` on 127.0.0.1:`port` with `flags`, run by this Python (the bench's own environment)."""
    return [sys.executable, "-m", "blockdraft.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--shutdown-grace", SHUTDOWN_GRACE, *flags]


def free_port() -> int:
    """A port the kernel just handed out on 127.0.0.1. It is released before the server binds it, a small race;
    `blockdraft serve` takes no bound socket, and a lost race ends in wait_ready's message with the log."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_ready(endpoint: Endpoint, timeout: float, process: subprocess.Popen | None = None,
               log_path: Path | None = None) -> None:
    """Poll GET /health until the server is ready (`ready`); refuse a started server (`process`) that exits, a
    given one that does not answer at all, and either that stays unready for `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise ConfigError(f"the {endpoint.label} server (`{shlex.join(process.args)}`) exited with code "
                              f"{process.returncode} before it was ready; its log ({log_path}) ends:\n"
                              f"{_tail(log_path)}\nfix the option it names, or start it yourself and pass --url")
        answer = _health(endpoint.url)
        if answer is None and process is None:
            raise ConfigError(f"nothing answers at {endpoint.url}/health; pass the --url of a running server")
        if answer is not None and ready(*answer):
            return
        if time.monotonic() > deadline:
            seen = "no answer" if answer is None else f"{answer[0]} {answer[1]}"
            where = f"; see its log {log_path}" if log_path else ""
            raise ConfigError(f"the {endpoint.label} server at {endpoint.url} was not ready within {timeout:g} s "
                              f"(/health: {seen}); raise --startup-timeout (a first start on a machine measures "
                              f"step costs for minutes){where}")
        time.sleep(POLL_SECONDS)


def ready(status: int, health: dict) -> bool:
    """Ready to be measured: /health says 200 and, from `blockdraft serve`, the step costs of every batch size up
    to --max-batch are measured. It answers 200 once one row can be priced and measures the larger batch sizes
    between batches (server/warmup.py): loaded before that, requests would wait seconds behind each measurement."""
    rows, most = health.get("batch_rows_ready"), health.get("max_batch")
    return status == 200 and (rows is None or most is None or rows >= most)


def _health(url: str) -> tuple[int, dict] | None:
    """GET /health's status and JSON body ({} for another body); None while nothing answers."""
    try:
        response = httpx.get(f"{url}/health", timeout=5)
    except httpx.HTTPError:
        return None
    try:
        body = response.json()
    except ValueError:
        body = {}
    return response.status_code, body if isinstance(body, dict) else {}


def stop(process: subprocess.Popen) -> None:
    """SIGTERM (the server drains, then exits 0), SIGKILL past STOP_SECONDS; a second Ctrl-C kills at once."""
    if process.poll() is not None:
        return
    try:
        process.terminate()
        process.wait(timeout=STOP_SECONDS)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        process.kill()
        process.wait()


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    except OSError as error:
        return f"(unreadable: {error})"
