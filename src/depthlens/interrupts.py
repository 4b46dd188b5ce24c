"""A stop that a signal requested, kept until the command line handles it.

:func:`depthlens.executors.local.install_sigterm_handler` installs :func:`raise_interrupt` for
SIGTERM: it raises :class:`KeyboardInterrupt`, so SIGTERM stops a command like Ctrl-C. Python
runs signal handlers between bytecodes of the main thread, and when that moment falls inside a
finaliser (a ``__del__`` method, a weakref callback) the exception is printed as "Exception
ignored" and dropped: the command would go on and exit 0. So the request is also recorded, and
:func:`raise_if_requested` (called where a run stores a unit) raises it again, for as long as
the handler is installed.
"""

from __future__ import annotations

import signal
import types

__all__ = ["clear", "raise_if_requested", "raise_interrupt"]

_requested: list[int] = []


def raise_interrupt(signum: int, frame: types.FrameType | None) -> None:
    """The SIGTERM handler: record the request, then raise :class:`KeyboardInterrupt`."""
    _requested.append(signum)
    raise KeyboardInterrupt(f"signal {signum}")


def clear() -> None:
    """Forget a recorded request (a new command starts, or the last one handled it)."""
    _requested.clear()


def raise_if_requested() -> None:
    """Raise :class:`KeyboardInterrupt` when a signal requested a stop while
    :func:`raise_interrupt` is the installed handler (a request whose first exception a
    finaliser swallowed); nothing otherwise.

    Examples
    --------
    >>> raise_if_requested()  # no request
    >>> _requested.append(15)
    >>> raise_if_requested()  # a request, but the handler is not installed: stale
    >>> clear()
    """
    if _requested and signal.getsignal(signal.SIGTERM) is raise_interrupt:
        raise KeyboardInterrupt(f"signal {_requested[0]}")
