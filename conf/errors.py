"""The one exception type a user can cause.

Every failure that comes from user input (a bad config value, a wrong checkpoint, a
malformed data row, a mismatched tokenizer) raises :class:`UserError` with a single line
that names the problem and the fix. The CLI prints that line and exits non-zero,
without a traceback; library callers can catch it like any other exception.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix. ``str(err)`` is one line: what is wrong, and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))
