"""A stop that a signal requested, kept until the command line handles it.

:func:`depthlens.executors.local.install_sigterm_handler` installs :func:`raise_interrupt` for
SIGTERM: it raises :class:`KeyboardInterrupt`, so SIGTERM stops a command like Ctrl-C. Python
runs signal handlers between bytecodes of the main thread, and when that moment falls inside a
finaliser (a ``__del__`` method, a weakref callback) the exception is printed as "Exception
ignored" and dropped: the command would go on and exit 0. So the request is also recorded, and
:func:`raise_if_requested` (called where a run stores a unit) raises it again, for as long as
the handler is installed; :func:`quiet_swallowed`, the unraisable-exception hook, keeps the
dropped exception off stderr (the command's only words on a stop are the one line saying
``--resume``). The signal is not delivered again from the hook: Python would run its handler
inside the hook, which drops it the same way.
"""

from __future__ import annotations

import signal
import sys
import types
from typing import Any

__all__ = ["clear", "install_quiet_hook", "quiet_swallowed", "raise_if_requested", "raise_interrupt"]

_requested: list[int] = []
_next_hook: list[Any] = []


def raise_interrupt(signum: int, frame: types.FrameType | None) -> None:
    """The SIGTERM handler: record the request, then raise :class:`KeyboardInterrupt`."""
    _requested.append(signum)
    raise KeyboardInterrupt(f"signal {signum}")


def _installed() -> bool:
    """Whether :func:`raise_interrupt` is the SIGTERM handler now."""
    return signal.getsignal(signal.SIGTERM) is raise_interrupt


def quiet_swallowed(unraisable: Any) -> None:
    """The unraisable-exception hook: a recorded SIGTERM's :class:`KeyboardInterrupt` that a
    finaliser swallowed prints nothing (:func:`raise_if_requested` raises it again); any other
    exception goes to the hook that was in place."""
    exc = unraisable.exc_value
    if isinstance(exc, KeyboardInterrupt) and _requested and _installed():
        return
    (_next_hook[0] if _next_hook else sys.__unraisablehook__)(unraisable)


def install_quiet_hook() -> None:
    """Make :func:`quiet_swallowed` the unraisable-exception hook, keeping the one in place
    for everything else (installing twice changes nothing)."""
    if sys.unraisablehook is not quiet_swallowed:
        _next_hook[:] = [sys.unraisablehook]
        sys.unraisablehook = quiet_swallowed


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
    if _requested and _installed():
        raise KeyboardInterrupt(f"signal {_requested[0]}")
