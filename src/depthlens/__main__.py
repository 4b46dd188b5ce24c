"""``python -m depthlens`` runs the command line.

An interrupted command (status 130) ends through :func:`depthlens.cli.end_process`. Under
``-m``, CPython ends the process by SIGINT (status -2) after its finalisation whenever a
KeyboardInterrupt once left string-compiled code (``exec`` or ``eval`` of a string, as
dataclass and namedtuple methods are made), even when the command caught it: a Ctrl-C or
SIGTERM landing there would end with -2 instead of the 130 the command line promises.
"""

import sys

from .cli import end_process, main

status = main()
if status == 130:
    end_process(status)
sys.exit(status)
