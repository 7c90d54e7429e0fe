"""turnwatch: run AI-agent turns durably — the Python side (docs/python.md).

- :mod:`turnwatch.agent`: write agent and tool programs (``run``, ``run_tool``, ``done``, ``fail``, ``call``); needs
  nothing but the standard library.
- :class:`turnwatch.Client`: submit turns, wait for their outcome, cancel them, post tool results and read turns,
  through PostgreSQL alone (needs psycopg 3, Debian's ``python3-psycopg``).
- :class:`turnwatch.Error`: every failure of a client call, with ``sqlstate`` and ``reason``.
- :class:`turnwatch.RateLimited`: raised by a tool's function, the pushback of flow control (retry after N s).
"""

from typing import TYPE_CHECKING, Any

from .agent import RateLimited
from .errors import BAD_INPUT, Error

__version__ = "0.1.0"
__all__ = ["BAD_INPUT", "Client", "Error", "Outcome", "RateLimited", "__version__"]

if TYPE_CHECKING:
    from .client import Client, Outcome


def __getattr__(name: str) -> Any:
    # The client needs psycopg; agent and tool programs (`from turnwatch import agent`) do not, so it is imported
    # only when asked for.
    if name in ("Client", "Outcome"):
        from . import client

        return getattr(client, name)
    raise AttributeError(f"module 'turnwatch' has no attribute {name!r}")
