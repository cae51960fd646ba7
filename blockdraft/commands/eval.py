"""`blockdraft eval`."""

from __future__ import annotations


def add_arguments(parser) -> None:
    pass


def run(args) -> int:
    raise SystemExit("blockdraft eval: not available in this version")
