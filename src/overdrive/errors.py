"""Errors shared across the package."""

__all__ = ["UserError"]


class UserError(Exception):
    """A problem with the user's input, with its fix in the message; the CLI prints it and exits 2."""
