"""The model a series starts from and its tokenizer: a family's configuration written in code
(:func:`depthlens.models.families.random_config`) at the sizes of the options, initialised
under the seed, with the byte-level tokenizer or the tokenizer of a given model."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InputError, ModelError, one_line
from .options import TrainOptions

__all__ = ["build_model", "check_family", "config_overrides", "load_tokenizer", "start_token"]


def check_family(name: str) -> None:
    """Refuse a family the registry does not hold.

    Raises
    ------
    InputError
        ``--family 'x' is unknown; use one of llama, gemma3, ...``.
    """
    from ..models import registry

    names = [entry.name for entry in registry.families()]
    if name not in names:
        raise InputError(f"--family {name!r} is unknown; use one of {', '.join(names)}.")


def load_tokenizer(spec: str) -> Any:
    """The tokenizer of the model ``spec`` (``--tokenizer``): an embedded model or ``.gguf``
    file (read with its model), a folder with tokenizer files, or a hub id (from the local
    cache when the hub is offline).

    Raises
    ------
    ModelError
        A spec of no model, or one whose tokenizer cannot be read (one line).
    """
    from ..models import hub
    from ..models.loading import load_model, spec_source
    from ..models.pretrained import quiet_transformers
    from ..models.tokenizer import tokenizer_from

    source = spec_source(spec)
    if source == "random":
        raise ModelError(f"--tokenizer {spec!r} is a random model, whose tokenizer is the byte-level one; "
                         "leave --tokenizer out for it.")
    if source is None:
        raise ModelError(f"--tokenizer {spec!r} is no model; pass smollm2-135m, a hub id, a folder or a .gguf file.")
    try:
        if source in ("embedded", "gguf"):
            return load_model(spec).tokenizer
        with quiet_transformers():
            if source == "local":
                return tokenizer_from(spec, local_files_only=True)
            return tokenizer_from(spec, local_files_only=hub.offline_reason() is not None)
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - files, network and format failures of many types
        raise ModelError(f"cannot read the tokenizer of --tokenizer {spec!r} ({one_line(exc, 160)}); pass a folder "
                         "or hub id that has one, or leave --tokenizer out for bytes.") from None


def start_token(tokenizer: Any) -> int:
    """The id every sequence starts with: BOS, or EOS where the tokenizer has no BOS (as the
    induction probe, :func:`depthlens.data.repeated_random_tokens`).

    Raises
    ------
    ModelError
        When the tokenizer has neither.
    """
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if start is None:
        raise ModelError("the tokenizer has neither a BOS nor an EOS token to start sequences with; pass another "
                         "--tokenizer.")
    return int(start)


def config_overrides(options: TrainOptions, tokenizer: Any | None) -> dict[str, Any]:
    """The configuration fields a series sets on its family's tiny configuration: the sizes,
    the context (``--seq-len``), the initial scale, every dropout at 0 (so a step is a
    function of the weights and the batch alone) and, with a given tokenizer, its vocabulary
    size and special-token ids."""
    from ..models import registry

    entry = registry.family(options.family)
    reference = entry.config_type()()
    values: dict[str, Any] = {
        "hidden_size": options.d_model, "num_hidden_layers": options.n_layers,
        "num_attention_heads": options.n_heads, "intermediate_size": options.d_ff,
        "max_position_embeddings": options.seq_len, "initializer_range": options.init_std,
    }
    if "num_key_value_heads" in entry.tiny_config:
        values["num_key_value_heads"] = options.n_heads
    values.update({k: 0.0 for k, v in reference.to_dict().items()
                   if ("dropout" in k or "pdrop" in k) and isinstance(v, float)})
    if tokenizer is not None:
        start = start_token(tokenizer)
        values.update(vocab_size=len(tokenizer), bos_token_id=start,
                      eos_token_id=tokenizer.eos_token_id if tokenizer.eos_token_id is not None else start)
    return values


def build_model(options: TrainOptions) -> tuple[torch.nn.Module, Any]:
    """The step-0 model of ``options`` in training mode, and its tokenizer.

    The weights are the family's own initialisation under ``torch.manual_seed(seed)``
    (:func:`depthlens.models.families.build_random`; the global RNG is left as it was), in
    float32, with PyTorch's scaled-dot-product attention for training (checkpoints load
    with eager attention, like every model).

    Raises
    ------
    InputError
        An unknown family.
    ModelError
        A tokenizer that cannot be read, or sizes the configuration refuses.
    """
    from ..models.families import build_random
    from ..models.tokenizer import random_tokenizer

    check_family(options.family)
    given = load_tokenizer(options.tokenizer) if options.tokenizer is not None else None
    model = build_random(options.family, config_overrides(options, given), seed=options.seed)
    tokenizer = given if given is not None else random_tokenizer(model)
    model.set_attn_implementation("sdpa")
    return model.train(), tokenizer
