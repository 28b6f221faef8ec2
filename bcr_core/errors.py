"""The one root of the mistakes a user can fix: a bad model, asset, argument, grid file, condition,
notebook parameter, or records that are damaged or belong to another run.

`bcr` (and `bcr grid`, per cell) catches `UsageError` alone and prints its message on one line;
any other exception is a bug and keeps its traceback. It derives from Exception alone, so a bug's
ValueError is never mistaken for a user's mistake, nor a user's mistake caught as a bug.
"""

from __future__ import annotations


class UsageError(Exception):
    """A mistake the user can fix; the message says what was wrong and what is expected."""
