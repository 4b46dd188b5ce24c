"""depthlens: a trained transformer language model as a dynamical system over depth.

The Python API (:mod:`depthlens.api`) is imported on first use, so ``import depthlens`` stays
light::

    import depthlens
    run = depthlens.analyse("random:llama", preset="quick", stages=["attention"])
    run.heads  # a pandas DataFrame
"""

from typing import Any

__version__ = "0.1.0"

__all__ = ["Run", "RunConfig", "__version__", "analyse", "census", "open_run", "sweep"]


def __getattr__(name: str) -> Any:
    if name in ("Run", "analyse", "census", "open_run", "sweep"):
        from . import api

        return getattr(api, name)
    if name == "RunConfig":
        from .config import RunConfig

        return RunConfig
    raise AttributeError(f"module 'depthlens' has no attribute {name!r}")
