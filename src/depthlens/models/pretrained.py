"""Reading checkpoints through transformers, shared by the GGUF, local-folder and hub loaders.

Quiet logging while loading (:func:`quiet_transformers`), the configuration
(:func:`load_config`), the weights of a saved folder (:func:`model_from_folder`: eager
attention, ``weights_only=True``, never a download), the one-line refusal of checkpoints that
need their own code (:func:`remote_code_error`), the library versions recorded in provenance
(:func:`versions`), and the :class:`Checkpoint` each loader hands to
:func:`depthlens.models.loading.load_model` to finish.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ..errors import ModelError

__all__ = ["Checkpoint", "load_config", "model_from_folder", "quiet_transformers", "remote_code_error",
           "versions"]


class Checkpoint(NamedTuple):
    """A model as a loader read it, before it is moved, cast, frozen and given its adapter."""

    model: torch.nn.Module
    tokenizer: Any
    name: str
    provenance: dict[str, Any]
    #: Where a streamed model's decoder layers come from (:mod:`depthlens.models.streaming`);
    #: None for a model held in memory.
    layers: Any = None


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """A context manager that silences transformers' info/warning chatter while loading."""
    try:
        from transformers.utils import logging as tlog
    except Exception:  # pragma: no cover
        yield
        return
    before = tlog.get_verbosity()
    tlog.set_verbosity_error()
    try:
        yield
    finally:
        tlog.set_verbosity(before)


def versions() -> dict[str, str]:
    """``transformers`` and ``torch``: the versions of the libraries that read the weights."""
    import transformers

    return {"transformers": transformers.__version__, "torch": torch.__version__}


def load_config(where: str, *, revision: str | None, trust_remote_code: bool, local: bool) -> Any:
    """The configuration of a folder or hub id (``local``: from files or the HF cache only)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(
        where, revision=revision, trust_remote_code=trust_remote_code, local_files_only=local
    )


def model_from_folder(
    folder: Path | str, dtype: torch.dtype, trust_remote_code: bool, use_safetensors: bool,
    revision: str | None = None, local: bool = True,
) -> torch.nn.Module:
    """The causal LM saved in ``folder`` (or hub id ``folder`` at ``revision`` with
    ``local=False``), in ``dtype``, with eager attention; pickled weights
    (``use_safetensors=False``) go through torch's restricted unpickler."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(folder),
        revision=revision,
        dtype=dtype,
        attn_implementation="eager",
        use_safetensors=use_safetensors,
        weights_only=True,
        local_files_only=local,
        trust_remote_code=trust_remote_code,
    )


def remote_code_error(spec: str, exc: BaseException) -> ModelError | None:
    """The one-line error for a checkpoint that needs ``trust_remote_code``, when ``exc`` says
    so; None for any other failure."""
    text = str(exc)
    if "trust_remote_code" in text:
        return ModelError(
            f"{spec} needs its own Python code to load; pass trust_remote_code=True "
            "(--trust-remote-code) only if you trust its authors."
        )
    return None
