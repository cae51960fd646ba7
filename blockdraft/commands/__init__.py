"""Command implementations behind the CLI: each formats what one library call returns."""
