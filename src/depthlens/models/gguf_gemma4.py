"""Gemma 4 GGUF files: the text configuration, read from the file's metadata and tensor list.

transformers' GGUF reader carries only part of a Gemma 4 configuration: its layer types,
per-layer inputs, shared keys and values, full-layer head shapes and rotary fraction take
transformers' defaults, which are those of no real model. llama.cpp's converter writes all of
them, and :func:`gemma4_config` reads them back (keys ``gemma4.<key>``):

============================================  ==================================================
GGUF                                          ``Gemma4TextConfig``
============================================  ==================================================
``attention.sliding_window_pattern``          ``layer_types`` (one bool a layer, true: sliding;
                                              an integer ``n``: every ``n``-th layer full)
``attention.key_length_swa`` / ``key_length`` ``head_dim`` / ``global_head_dim`` (each must
                                              equal its ``value_length``)
``attention.head_count_kv``                   ``num_key_value_heads`` (sliding layers) and
                                              ``num_global_key_value_heads`` (full layers); an
                                              integer or one entry a layer
``attention.shared_kv_layers``                ``num_kv_shared_layers``
``feed_forward_length``                       ``intermediate_size``; one entry a layer, doubled
                                              on the shared layers: ``use_double_wide_mlp``
``embedding_length_per_layer_input``          ``hidden_size_per_layer_input`` (0: none)
``rope.freq_base`` / ``rope.freq_base_swa``   the full / sliding layers' ``rope_theta`` (the
                                              ``_swa`` key is required where a layer slides)
``rope_freqs`` tensor                         the full layers' proportional rotary fraction:
                                              ``n`` factors of 1 then factors ≥ 1e29 (no
                                              rotation) give ``partial_rotary_factor``
                                              ``2 n / global_head_dim``
``final_logit_softcapping``                   the same (absent: none)
============================================  ==================================================

From the tensor list: ``attention_k_eq_v`` (the full layers that compute keys have no
``attn_v``), the vocabularies (``token_embd`` and ``per_layer_token_embd`` rows) and
``tie_word_embeddings`` (no ``output``). The converter writes norms unshifted (Gemma 4 scales
by ``weight``) and no query/key permutation, so the tensors need no processing beyond the
name map; the layer scalar is stored as ``blk.N.layer_output_scale.weight``. Float settings,
stored as float32, are read as the shortest decimal that rounds to the stored value (the
value the converter was given).

A file the configuration cannot represent exactly is refused in one line: expert tensors
(a mixture-of-experts model), partial rotary sliding layers, a ``rope_freqs`` that is not
proportional, key/value head counts or MLP widths that vary other than Gemma 4's way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelError, one_line

__all__ = ["gemma4_config"]

_ARCH = "gemma4"
#: A rotary frequency factor at least this large leaves its pair unrotated (llama.cpp writes 1e30).
_NO_ROTATION = 1e29
_REQUIRED = object()


def _refuse(path: Path, what: str) -> ModelError:
    return ModelError(f"{path}: {what}; depthlens cannot represent it as a Gemma 4 configuration, so pass the "
                      "model's safetensors folder or hub id instead.")


def _decimal(value: Any) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it: the value the
    converter was given (``1e-06``, not ``9.99999997e-07``)."""
    return float(str(np.float32(value)))


def _per_layer(value: Any, n_layers: int, key: str, path: Path) -> list[int]:
    """An integer, or one entry a layer, as one integer a layer."""
    values = [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)] * n_layers
    if len(values) != n_layers:
        raise _refuse(path, f"gemma4.{key} has {len(values)} entries for {n_layers} layers")
    return values


def _one_value(values: list[int], layers: list[int], what: str, path: Path) -> int | None:
    """The value shared by ``layers`` (``None`` when there are none)."""
    found = sorted({values[i] for i in layers})
    if len(found) > 1:
        raise _refuse(path, f"its {what} differ between layers ({found})")
    return found[0] if found else None


def gemma4_config(reader: Any, path: Path) -> Any:
    """The ``Gemma4TextConfig`` of a Gemma 4 GGUF file written as llama.cpp's converter writes it.

    Parameters
    ----------
    reader : gguf.GGUFReader
        The file's reader, listing the tensors of every shard of a split model.
    path : Path
        The file, for messages.

    Returns
    -------
    transformers.Gemma4TextConfig
        Every setting the layers' shapes and arithmetic depend on, read from the file (see the
        module's table); ``hidden_activation`` is the tanh GELU llama.cpp computes.

    Raises
    ------
    ModelError
        A missing key, or a file the configuration cannot represent exactly.
    """
    from gguf import dequantize
    from transformers import Gemma4TextConfig

    def field(key: str, default: Any = _REQUIRED) -> Any:
        found = reader.fields.get(key)
        if found is None:
            if default is _REQUIRED:
                raise ModelError(f"{path} has no {key} entry, which a Gemma 4 GGUF file holds; convert the model "
                                 "again with a current llama.cpp.")
            return default
        return found.contents()

    def arch(key: str, default: Any = _REQUIRED) -> Any:
        return field(f"{_ARCH}.{key}", default)

    tensors = {tensor.name: tensor for tensor in reader.tensors}
    experts = sorted(name for name in tensors if "_exps" in name or ".ffn_gate_inp" in name)
    if experts:
        raise ModelError(f"{path} holds expert tensors ({experts[0]}): a Gemma 4 mixture-of-experts model "
                         "(enable_moe_block=True), which depthlens does not read; use a dense Gemma 4 (E2B, E4B, 31B).")
    n_layers = int(arch("block_count"))
    pattern = arch("attention.sliding_window_pattern")
    if isinstance(pattern, (list, tuple)):
        sliding = [bool(v) for v in pattern]
    else:
        sliding = [bool((i + 1) % int(pattern)) for i in range(n_layers)]
    if len(sliding) != n_layers:
        raise _refuse(path, f"gemma4.attention.sliding_window_pattern has {len(sliding)} entries for {n_layers} layers")
    layer_types = ["sliding_attention" if s else "full_attention" for s in sliding]
    head_dim, global_head_dim = int(arch("attention.key_length_swa")), int(arch("attention.key_length"))
    if (int(arch("attention.value_length_swa", head_dim)) != head_dim
            or int(arch("attention.value_length", global_head_dim)) != global_head_dim):
        raise _refuse(path, "its value heads are not as wide as its key heads")
    if int(arch("rope.dimension_count_swa", head_dim)) != head_dim:
        raise _refuse(path, "its sliding layers rotate part of each head (rope.dimension_count_swa < key_length_swa)")
    shared = int(arch("attention.shared_kv_layers", 0))
    producers = range(n_layers - shared)
    full = [i for i in range(n_layers) if not sliding[i]]
    kv_heads = _per_layer(arch("attention.head_count_kv"), n_layers, "attention.head_count_kv", path)
    kv_sliding = _one_value(kv_heads, [i for i in range(n_layers) if sliding[i]], "sliding layers' key/value heads",
                            path)
    kv_full = _one_value(kv_heads, full, "full layers' key/value heads", path)
    own_values = {f"blk.{i}.attn_v.weight" in tensors for i in producers if not sliding[i]}
    if len(own_values) > 1:
        raise _refuse(path, "some of its full layers have value projections and others not")
    k_eq_v = own_values == {False}
    if any(sliding[i] and f"blk.{i}.attn_v.weight" not in tensors for i in producers):
        raise _refuse(path, "a sliding layer has no value projection")
    if kv_full is not None and kv_sliding is not None and kv_full != kv_sliding and not k_eq_v:
        raise _refuse(path, "its full layers have their own key/value head count but also value projections")
    widths = _per_layer(arch("feed_forward_length"), n_layers, "feed_forward_length", path)
    double = shared > 0 and widths == [widths[0] * (2 if i >= n_layers - shared else 1) for i in range(n_layers)]
    if not double and len(set(widths)) > 1:
        raise _refuse(path, f"its MLP widths {sorted(set(widths))} vary other than doubling on the shared layers")
    theta = _decimal(arch("rope.freq_base"))
    theta_swa = _decimal(arch("rope.freq_base_swa", _REQUIRED if any(sliding) else theta))
    partial = 1.0
    if full:
        if "rope_freqs.weight" in tensors:
            factors = np.asarray(dequantize(tensors["rope_freqs.weight"].data,
                                            tensors["rope_freqs.weight"].tensor_type), dtype=np.float64).reshape(-1)
            n_rot = int(np.count_nonzero(factors == 1.0))
            if (factors.size != global_head_dim // 2 or not np.all(factors[:n_rot] == 1.0)
                    or not np.all(factors[n_rot:] >= _NO_ROTATION)):
                raise _refuse(path, "its rope_freqs tensor is not the proportional rotation Gemma 4 uses "
                                    "(factors of 1, then ≥ 1e29)")
            partial = 2 * n_rot / global_head_dim
        elif int(arch("rope.dimension_count", global_head_dim)) != global_head_dim:
            raise _refuse(path, "its full layers rotate part of each head without a rope_freqs tensor")
    per_layer = int(arch("embedding_length_per_layer_input", 0))
    if "token_embd.weight" not in tensors:
        raise ModelError(f"{path} holds no token_embd.weight; the file is incomplete.")
    vocab = int(tensors["token_embd.weight"].shape[-1])
    per_layer_vocab = int(tensors["per_layer_token_embd.weight"].shape[-1]) if per_layer else vocab
    softcap = arch("final_logit_softcapping", None)
    kwargs: dict[str, Any] = {
        "vocab_size": vocab, "hidden_size": int(arch("embedding_length")), "intermediate_size": widths[0],
        "num_hidden_layers": n_layers, "num_attention_heads": int(arch("attention.head_count")),
        "num_key_value_heads": kv_sliding if kv_sliding is not None else kv_full, "head_dim": head_dim,
        "global_head_dim": global_head_dim, "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": int(arch("context_length")),
        "rms_norm_eps": _decimal(arch("attention.layer_norm_rms_epsilon")),
        "sliding_window": int(arch("attention.sliding_window")), "layer_types": layer_types,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": theta_swa},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": partial, "rope_theta": theta},
        },
        "final_logit_softcapping": None if softcap is None else _decimal(softcap),
        "vocab_size_per_layer_input": per_layer_vocab, "hidden_size_per_layer_input": per_layer,
        "attention_k_eq_v": k_eq_v, "num_kv_shared_layers": shared, "use_double_wide_mlp": double,
        "enable_moe_block": False, "attention_bias": False,
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": field("tokenizer.ggml.bos_token_id", None),
        "eos_token_id": field("tokenizer.ggml.eos_token_id", None),
        "pad_token_id": field("tokenizer.ggml.padding_token_id", None),
        "architectures": ["Gemma4ForCausalLM"],
    }
    if k_eq_v and kv_full is not None:
        kwargs["num_global_key_value_heads"] = kv_full
    try:
        config = Gemma4TextConfig(**kwargs)
        config.kv_sharing_modes  # noqa: B018 - raises where a shared layer's type has no producer
    except Exception as exc:
        raise _refuse(path, f"its settings do not form a Gemma 4 configuration ({one_line(exc)})") from None
    if list(config.layer_types) != layer_types:
        raise _refuse(path, "its last layer is a sliding one, where Gemma 4 ends with a full-attention layer")
    return config
