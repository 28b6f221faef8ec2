"""The one root of the mistakes a user can fix: a bad model, asset, argument, grid file, condition,
notebook parameter, or records that are damaged or belong to another run.

`bcr` (and `bcr grid`, per cell) catches `UsageError` alone and prints its message on one line;
any other exception is a bug and keeps its traceback. It subclasses ValueError, so callers that
caught the ValueErrors these sites raised before keep working.
"""

from __future__ import annotations


class UsageError(ValueError):
    """A mistake the user can fix; the message says what was wrong and what is expected."""
