"""turnwatch.Error: what the client raises for every failure (docs/python.md).

Kept apart from the client so that agent and tool programs, which do not need psycopg, can import it too.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["Error", "BAD_INPUT"]

#: SQLSTATE of bad input (invalid_parameter_value), from the database's API functions and from the client's own
#: checks alike (docs/limits.md and docs/operations.md).
BAD_INPUT = "22023"


class Error(Exception):
    """A failure of a turnwatch call.

    Attributes:
        sqlstate: the five-character SQLSTATE when PostgreSQL (or the client's own check of an argument, which
            then says ``22023`` as the database would) gave one; ``None`` for failures without one, such as a
            connection that could not be made.
        reason: the reason in words (PostgreSQL's primary message, without the ``ERROR:`` prefix).
        detail: PostgreSQL's detail message, if any.
        hint: PostgreSQL's hint, if any.
    """

    def __init__(self, reason: str, sqlstate: Optional[str] = None, *, detail: Optional[str] = None,
                 hint: Optional[str] = None) -> None:
        self.reason = reason
        self.sqlstate = sqlstate
        self.detail = detail
        self.hint = hint
        super().__init__(f"{reason} (SQLSTATE {sqlstate})" if sqlstate else reason)

    @classmethod
    def bad_input(cls, reason: str) -> "Error":
        """An error for an argument the client refuses before it reaches the database (SQLSTATE 22023)."""
        return cls(reason, BAD_INPUT)
