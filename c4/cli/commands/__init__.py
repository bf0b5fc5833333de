"""Subcommands of `c4`; each module has `register(subparsers)`."""
