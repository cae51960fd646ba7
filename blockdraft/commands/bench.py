"""`blockdraft bench`."""

from __future__ import annotations


def add_arguments(parser) -> None:
    pass


def run(args) -> int:
    raise SystemExit("blockdraft bench: not available in this version")
