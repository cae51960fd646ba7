"""Errors raised by blockdraft.

Every message states what is wrong, the value found, and how to fix it (STYLE.md §2.7), e.g.
"`block_size` must be at least 2, got 1; set `block_size` in config.json".
"""


class BlockdraftError(Exception):
    """Base class of every error blockdraft raises on purpose."""


class ConfigError(BlockdraftError, ValueError):
    """A draft config (or a combination of draft and target) that must not be used."""


class CheckpointError(BlockdraftError, ValueError):
    """A checkpoint folder that is missing, corrupt or does not match its target."""


class InputError(BlockdraftError, ValueError):
    """A request that cannot be served as asked: empty prompt, too long, bad parameter."""
