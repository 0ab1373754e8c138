"""Errors the store raises for its callers (the worker, the server and the CLI turn them into one clear line)."""

from __future__ import annotations


class StoreNotMigratedError(RuntimeError):
    """The database schema is not at the head revision: the message says which command fixes it."""
