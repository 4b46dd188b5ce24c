"""One interface to every supported decoder-only architecture.

An :class:`Adapter` wraps a Hugging Face causal LM and exposes it as a dynamical system over
depth. Places in the model are named ``(layer, sublayer, head)`` with ``sublayer`` in
``{"attn", "mlp"}``; layers and heads are 0-based.

Residual states
    ``residual_states(ids)[2 * l]`` is the pre-attention residual of layer ``l`` (the input
    of decoder layer ``l``), ``[2 * l + 1]`` the pre-MLP residual of layer ``l`` (after the
    attention sub-layer's skip connection) and ``[2 * L]`` the output of the last layer
    before the final norm. For parallel-residual models (GPT-NeoX / Pythia with
    ``use_parallel_residual``) the pre-MLP state is *defined* as ``h + Attn(ln_1(h))``; the
    model's MLP reads ``ln_2(h)`` of the pre-attention state ``h``, not of this state.

Sub-layer maps
    ``sublayer(l, "attn")`` is ``h -> h + Attn(norm(h))`` and ``sublayer(l, "mlp")`` is
    ``g -> g + MLP(norm(g))``, each with the family's pre- and post-norms, applied to whole
    sequences ``(B, T, d)`` at positions ``0 .. T-1`` (causal mask, sliding windows, eager
    attention arithmetic in the model dtype, independent of the model's
    ``attn_implementation``). They are pure functions of their argument (differentiable,
    usable with ``torch.func``), except that head-ablation hooks on the output projection
    act on them too. For parallel-residual models ``sublayer(l, "mlp")`` raises
    :class:`ModelError` (the MLP is not a function of the pre-MLP state): use ``block(l)``
    or ``branch(l, "mlp")`` (the MLP branch as a function of the pre-attention state).

Attention probabilities
    Recomputed in float64 from the pre-softmax scores: the attention module's input is
    captured during one forward pass, queries and keys are formed exactly as the model does
    (projections, q/k norms and RoPE in the model dtype), then cast to float64 for the
    scaled scores, soft-capping, causal / sliding-window mask and softmax. Masked entries
    are exact zeros; every row sums to one. Each query head has its own matrix (grouped
    key/value heads are repeated).

Hooks (context managers that always remove themselves)
    ``ablate_head`` replaces query-head outputs at the input of the attention output
    projection; ``clamp`` overwrites residual entries at the input of decoder layers
    ``>= from_layer`` and at the input of the final norm.

Inputs are token ids ``(B, T)`` (or ``(T,)``, read as ``B = 1``) without padding; the
adapter never adds a BOS token (see :meth:`Adapter.prepend_bos`).
"""

from __future__ import annotations

import contextlib
import operator
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import InputError, ModelError
from .families import family_of, text_config

Sublayer = str  # "attn" | "mlp"
SUBLAYERS: tuple[str, ...] = ("attn", "mlp")
ABLATION_MODES: tuple[str, ...] = ("zero", "mean", "resample")


class _Stop(Exception):
    """Raised inside a hook to end a forward pass early once everything needed is captured."""


def _as_index(value: object) -> int | None:
    """``value`` as a Python int if it is an integer (numpy integers included, bools not)."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _first_arg(args: tuple, kwargs: dict, name: str = "hidden_states") -> Tensor:
    if args:
        return args[0]
    if name in kwargs:
        return kwargs[name]
    raise ModelError(f"could not find the {name} argument of a hooked module; the model layout is unexpected.")


def _replace_first_arg(args: tuple, kwargs: dict, value: Tensor, name: str = "hidden_states") -> tuple:
    if args:
        return (value, *args[1:]), kwargs
    kwargs = dict(kwargs)
    kwargs[name] = value
    return args, kwargs


def _repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """(B, KV, T, d) -> (B, KV * n_rep, T, d); query head j reads key/value head j // n_rep."""
    return x if n_rep == 1 else torch.repeat_interleave(x, n_rep, dim=1)


class Adapter(ABC):
    """A causal LM seen as a stack of sub-layer maps (abstract; one subclass per family).

    Attributes
    ----------
    model : torch.nn.Module
        The wrapped ``*ForCausalLM`` module (put in eval mode).
    family : str
        The family name (see :data:`depthlens.models.families.FAMILIES`).
    n_layers, n_heads, n_kv_heads, head_dim, d_model, max_seq_len : int
        Shape of the model (``n_heads`` query heads per layer).
    bos_token_id : int or None
        From the configuration; None when the configuration has none.
    sliding_windows : list of (int or None)
        Per layer, the number of keys a query sees (itself included) or None for full causal
        attention: a query at position i attends to j with ``i - W < j <= i``.
    parallel_residual : bool
        True when attention and MLP read the same residual (GPT-NeoX / Pythia).

    Examples
    --------
    >>> from depthlens.models import build_random, adapter_for
    >>> import torch
    >>> ad = adapter_for(build_random("llama"))
    >>> ids = torch.randint(0, 256, (1, 8))
    >>> layer, A = next(ad.attention_probs(ids))
    >>> A.shape, A.dtype
    (torch.Size([1, 4, 8, 8]), torch.float64)
    """

    family: str = ""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.config = text_config(model.config)
        if model.training:
            model.eval()
        try:
            self.backbone, self.lm_head = self._locate(model)
            self.layers: Sequence[nn.Module] = list(self._layer_list())
            self._attns = [self._attn(layer) for layer in self.layers]
            self._oprojs = [self._out_proj(a) for a in self._attns]
            self._final_norm_module = self._final_norm()
        except AttributeError as exc:
            raise ModelError(
                f"{type(model).__name__} does not have the layout of a {self.family} causal LM ({exc}); "
                "load it with transformers' AutoModelForCausalLM (no remote code)."
            ) from exc
        cfg = self.config
        self.n_layers: int = len(self.layers)
        self.n_heads: int = int(cfg.num_attention_heads)
        self.n_kv_heads: int = int(getattr(cfg, "num_key_value_heads", None) or self.n_heads)
        self.head_dim: int = int(self._head_dim())
        self.d_model: int = int(cfg.hidden_size)
        self.max_seq_len: int = int(cfg.max_position_embeddings)
        bos = getattr(cfg, "bos_token_id", None)
        if bos is None:
            bos = getattr(model.config, "bos_token_id", None)
        self.bos_token_id: int | None = None if bos is None else int(bos)
        self.sliding_windows: list[int | None] = [self._sliding_window(i) for i in range(self.n_layers)]
        self.parallel_residual: bool = bool(self._parallel_residual())
        if self.n_heads % self.n_kv_heads:
            raise ModelError(f"{self.n_heads} query heads are not a multiple of {self.n_kv_heads} key/value heads.")
        self._rotary_fn = getattr(sys.modules[type(self._attns[0]).__module__], "apply_rotary_pos_emb", None)

    # ------------------------------------------------------------------ family-specific

    @abstractmethod
    def _locate(self, model: nn.Module) -> tuple[nn.Module, nn.Module]:
        """(backbone with the decoder layers, lm head)."""

    @abstractmethod
    def _layer_list(self) -> Sequence[nn.Module]:
        """The decoder layers, in order."""

    @abstractmethod
    def _attn(self, layer: nn.Module) -> nn.Module:
        """The self-attention module of a decoder layer."""

    @abstractmethod
    def _out_proj(self, attn: nn.Module) -> nn.Module:
        """The output projection, whose input is the concatenation of head outputs (B, T, H * hd)."""

    @abstractmethod
    def _final_norm(self) -> nn.Module:
        """The norm applied after the last layer."""

    @abstractmethod
    def embed(self, input_ids: Tensor) -> Tensor:
        """Token ids (B, T) -> the input of layer 0, h0 (B, T, d), at positions 0 .. T-1."""

    @abstractmethod
    def qkv(self, layer: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries (B, H, T, hd), keys and values (B, KV, T, hd) from the attention module's input.

        ``x`` is what the model feeds its attention module (already normed for pre-norm
        families); q/k norms and rotary position embeddings (positions 0 .. T-1) are
        applied exactly as in the model, in the model dtype.
        """

    @abstractmethod
    def _attn_input(self, layer: int, h: Tensor) -> Tensor:
        """Residual -> attention module input (the pre-attention norm, or identity)."""

    def _attn_post(self, layer: int, a: Tensor) -> Tensor:
        """Output projection result -> what is added to the residual (post-norm, if any)."""
        return a

    @abstractmethod
    def _mlp_branch(self, layer: int, g: Tensor) -> Tensor:
        """Residual -> what the MLP adds to it (pre-norm, MLP, post-norm as the family has)."""

    @abstractmethod
    def _pre_mlp_module(self, layer: int) -> nn.Module | None:
        """A module whose first input is the pre-MLP residual of ``layer`` (None if there is none)."""

    def _head_dim(self) -> int:
        hd = getattr(self._attns[0], "head_dim", None) or getattr(self.config, "head_dim", None)
        return int(hd or self.config.hidden_size // self.config.num_attention_heads)

    def _sliding_window(self, layer: int) -> int | None:
        attn = self._attns[layer]
        if hasattr(attn, "sliding_window"):
            w = attn.sliding_window
        else:
            w = getattr(self.config, "sliding_window", None)
            types = getattr(self.config, "layer_types", None)
            if types is not None and types[layer] != "sliding_attention":
                w = None
        return None if w is None else int(w)

    def _parallel_residual(self) -> bool:
        return False

    def _scaling(self, layer: int) -> float:
        return float(self._attns[layer].scaling)

    def _softcap(self, layer: int) -> float | None:
        """Tanh soft-cap of attention scores, where the model applies one (no current family does:
        Gemma 3's modeling code keeps ``attn_logit_softcapping`` in its config but never passes it on)."""
        return None

    def _final_softcap(self) -> float | None:
        cap = getattr(self.config, "final_logit_softcapping", None)
        return None if cap is None else float(cap)

    def _rope_module(self) -> nn.Module | None:
        return getattr(self.backbone, "rotary_emb", None)

    def _position_embeddings(self, layer: int, T: int, like: Tensor) -> tuple[Tensor, Tensor]:
        """(cos, sin) for positions 0 .. T-1, as the model's rotary module computes them."""
        rope = self._rope_module()
        pos = torch.arange(T, device=like.device).unsqueeze(0)
        dummy = torch.empty(0, dtype=like.dtype, device=like.device)
        types = getattr(self.config, "layer_types", None)
        if types is not None and isinstance(getattr(rope, "rope_type", None), dict):  # per-layer-type RoPE
            return rope(dummy, pos, types[layer])
        return rope(dummy, pos)

    def _rotate(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        if self._rotary_fn is None:  # pragma: no cover - every RoPE family module defines it
            raise ModelError(f"{self.family}: the modeling module has no apply_rotary_pos_emb.")
        return self._rotary_fn(q, k, cos, sin)

    # ------------------------------------------------------------------ helpers

    def _ids(self, input_ids: Tensor) -> Tensor:
        ids = torch.as_tensor(input_ids)
        if ids.ndim == 1:
            ids = ids.unsqueeze(0)
        if ids.ndim != 2 or ids.shape[1] == 0 or ids.shape[0] == 0:
            raise InputError(f"input_ids has shape {tuple(ids.shape)}; pass token ids of shape (B, T) with T >= 1.")
        if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
            raise InputError(f"input_ids has dtype {ids.dtype}; pass integer token ids.")
        if ids.shape[1] > self.max_seq_len:
            raise InputError(
                f"input_ids has {ids.shape[1]} positions; this model handles at most {self.max_seq_len}."
            )
        vocab = int(self.config.vocab_size)
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise InputError(f"input_ids holds ids outside [0, {vocab}); check the tokenizer matches the model.")
        return ids.long().to(self.device)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def _check_layer(self, layer: int, *, allow_end: bool = False) -> int:
        top = self.n_layers if allow_end else self.n_layers - 1
        index = _as_index(layer)
        if index is None or not 0 <= index <= top:
            raise InputError(f"layer {layer!r} is out of range; this model has layers 0 .. {self.n_layers - 1}.")
        return index

    def _check_heads(self, head: int | Iterable[int]) -> list[int]:
        heads = [head] if _as_index(head) is not None else list(head)
        if not heads:
            raise InputError("no heads given; pass a head index or a non-empty list of them.")
        for i, h in enumerate(heads):
            index = _as_index(h)
            if index is None or not 0 <= index < self.n_heads:
                raise InputError(f"head {h!r} is out of range; layers have heads 0 .. {self.n_heads - 1}.")
            heads[i] = index
        if len(set(heads)) != len(heads):
            raise InputError(f"heads {heads} repeat an index; list each head once.")
        return heads

    def _allowed(self, layer: int, T: int, device: torch.device) -> Tensor:
        """Boolean (T, T): query i may attend to key j (causal, sliding window)."""
        i = torch.arange(T, device=device)[:, None]
        j = torch.arange(T, device=device)[None, :]
        ok = j <= i
        w = self.sliding_windows[layer]
        if w is not None:
            ok = ok & (i - j < w)
        return ok

    def _forward(self, ids: Tensor) -> Any:
        return self.model(input_ids=ids, use_cache=False)

    def prepend_bos(self, input_ids: Tensor) -> Tensor:
        """Put ``bos_token_id`` in front of every row of ``input_ids`` (B, T) -> (B, T + 1).

        Raises
        ------
        ModelError
            If the configuration names no BOS token.
        """
        if self.bos_token_id is None:
            raise ModelError(f"this {self.family} model's configuration names no bos_token_id; pass ids as they are.")
        ids = torch.as_tensor(input_ids)
        if ids.ndim == 1:
            ids = ids.unsqueeze(0)
        bos = torch.full((ids.shape[0], 1), self.bos_token_id, dtype=ids.dtype, device=ids.device)
        return torch.cat([bos, ids], dim=1)

    # ------------------------------------------------------------------ attention

    def attention_core(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Eager attention in the model dtype: (B, H, T, hd), (B, KV, T, hd) x2 -> head outputs (B, T, H * hd).

        Scores are scaled, soft-capped, masked (causal, sliding window) and soft-maxed in
        float32 as Hugging Face's eager path does.
        """
        n_rep = self.n_heads // self.n_kv_heads
        k = _repeat_kv(k, n_rep)
        v = _repeat_kv(v, n_rep)
        T = q.shape[-2]
        scores = torch.matmul(q, k.transpose(-1, -2)) * self._scaling(layer)
        cap = self._softcap(layer)
        if cap is not None:
            scores = torch.tanh(scores / cap) * cap
        mask = torch.zeros((T, T), dtype=scores.dtype, device=scores.device)
        mask = mask.masked_fill(~self._allowed(layer, T, scores.device), torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores + mask, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2)
        return out.reshape(*out.shape[:2], -1)

    def probs_from_qk(self, layer: int, q: Tensor, k: Tensor) -> Tensor:
        """Float64 attention probabilities (B, H, T, T) from queries (B, H, T, hd) and keys (B, KV, T, hd)."""
        q64 = q.to(torch.float64)
        k64 = _repeat_kv(k, self.n_heads // self.n_kv_heads).to(torch.float64)
        scores = torch.matmul(q64, k64.transpose(-1, -2)) * self._scaling(layer)
        cap = self._softcap(layer)
        if cap is not None:
            scores = torch.tanh(scores / cap) * cap
        T = q.shape[-2]
        scores = scores.masked_fill(~self._allowed(layer, T, scores.device), float("-inf"))
        return torch.softmax(scores, dim=-1)

    def attention_probs(
        self, input_ids: Tensor, layers: int | Iterable[int] | None = None
    ) -> Iterator[tuple[int, Tensor]]:
        """Yield ``(layer, A)`` with ``A`` the float64 attention probabilities (B, H, T, T).

        One forward pass captures the attention inputs of the requested layers (it stops
        after the last of them); the float64 matrices are then formed one layer at a time,
        so only one layer's matrices are alive at once. Active ablations and clamps act on
        that forward pass, so the probabilities of later layers reflect them.

        Parameters
        ----------
        input_ids : Tensor (B, T)
        layers : int or iterable of int, optional
            Which layers (default all), yielded in the order given.

        Raises
        ------
        InputError
            For bad ids or layer indices.
        """
        ids = self._ids(input_ids)
        if layers is None:
            wanted = list(range(self.n_layers))
        else:
            wanted = [layers] if isinstance(layers, int) else list(layers)
            for layer in wanted:
                self._check_layer(layer)
        return self._attention_probs(ids, wanted)

    def _attention_probs(self, ids: Tensor, wanted: list[int]) -> Iterator[tuple[int, Tensor]]:
        captured = self.attention_inputs(ids, set(wanted))
        for layer in wanted:
            x = captured[layer]
            with torch.no_grad():
                q, k, _ = self.qkv(layer, x)
                yield layer, self.probs_from_qk(layer, q, k)

    def attention_inputs(self, input_ids: Tensor, layers: Iterable[int] | None = None) -> dict[int, Tensor]:
        """The inputs of the attention modules of ``layers`` (B, T, d), from one (early-stopped) forward pass."""
        ids = self._ids(input_ids)
        wanted = set(range(self.n_layers)) if layers is None else {self._check_layer(i) for i in layers}
        if not wanted:
            return {}
        last = max(wanted)
        captured: dict[int, Tensor] = {}
        handles = []

        def make(i: int) -> Callable:
            def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
                captured[i] = _first_arg(args, kwargs).detach()
                if i == last:
                    raise _Stop

            return hook

        try:
            for i in wanted:
                handles.append(self._attns[i].register_forward_pre_hook(make(i), with_kwargs=True))
            with torch.no_grad(), contextlib.suppress(_Stop):
                self._forward(ids)
        finally:
            for h in handles:
                h.remove()
        return captured

    # ------------------------------------------------------------------ residual stream

    def residual_states(self, input_ids: Tensor) -> Tensor:
        """The residual stream ``(2L + 1, B, T, d)`` in the model dtype, from one forward pass.

        Index ``2l`` is the input of layer ``l``, ``2l + 1`` its pre-MLP residual (for parallel
        residual models ``h + Attn(ln_1(h))``), ``2L`` the last layer's output before the final
        norm. Active clamps and ablations are reflected.
        """
        ids = self._ids(input_ids)
        L = self.n_layers
        states: list[Tensor | None] = [None] * (2 * L + 1)
        handles = []

        def pre_layer(i: int) -> Callable:
            def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
                states[2 * i] = _first_arg(args, kwargs).detach()

            return hook

        def pre_mlp(i: int) -> Callable:
            def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
                states[2 * i + 1] = _first_arg(args, kwargs).detach()

            return hook

        def attn_out(i: int) -> Callable:
            def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
                a = output[0] if isinstance(output, tuple) else output
                states[2 * i + 1] = states[2 * i] + a.detach()

            return hook

        def final(module: nn.Module, args: tuple, kwargs: dict) -> None:
            states[2 * L] = _first_arg(args, kwargs, "input").detach()

        try:
            for i, layer in enumerate(self.layers):
                handles.append(layer.register_forward_pre_hook(pre_layer(i), with_kwargs=True))
                mod = self._pre_mlp_module(i)
                if mod is None:
                    handles.append(self._attns[i].register_forward_hook(attn_out(i), with_kwargs=True))
                else:
                    handles.append(mod.register_forward_pre_hook(pre_mlp(i), with_kwargs=True))
            handles.append(self._final_norm_module.register_forward_pre_hook(final, with_kwargs=True))
            with torch.no_grad():
                self._forward(ids)
        finally:
            for h in handles:
                h.remove()
        missing = [i for i, s in enumerate(states) if s is None]
        if missing:
            raise ModelError(f"residual states {missing} were not seen in the forward pass; the layout is unexpected.")
        return torch.stack(states)  # type: ignore[arg-type]

    def logits(self, input_ids: Tensor) -> Tensor:
        """The model's own logits (B, T, V) (no gradient)."""
        ids = self._ids(input_ids)
        with torch.no_grad():
            return self._forward(ids).logits

    # ------------------------------------------------------------------ sub-layer maps

    def _check_sublayer(self, kind: str) -> str:
        if kind not in SUBLAYERS:
            raise InputError(f"sublayer {kind!r} is not one of {SUBLAYERS}.")
        return kind

    def branch(self, layer: int, kind: Sublayer) -> Callable[[Tensor], Tensor]:
        """What sub-layer ``kind`` of ``layer`` adds to the residual, as a function of the residual it reads.

        ``branch(l, "attn")``: ``h -> post(Attn(norm(h)))``; ``branch(l, "mlp")``:
        ``g -> post(MLP(norm(g)))``. For parallel-residual models the MLP branch reads the
        pre-attention state ``h`` (so ``block(l)(h) = h + branch(l, "attn")(h) + branch(l, "mlp")(h)``).
        """
        self._check_layer(layer)
        self._check_sublayer(kind)
        if kind == "mlp":
            return lambda g: self._mlp_branch(layer, g)

        def attn_branch(h: Tensor) -> Tensor:
            x = self._attn_input(layer, h)
            q, k, v = self.qkv(layer, x)
            o = self.attention_core(layer, q, k, v)
            return self._attn_post(layer, self._oprojs[layer](o))

        return attn_branch

    def sublayer(self, layer: int, kind: Sublayer) -> Callable[[Tensor], Tensor]:
        """Sub-layer ``kind`` of ``layer`` with its skip connection: (B, T, d) -> (B, T, d).

        ``"attn"``: pre-attention residual -> pre-MLP residual; ``"mlp"``: pre-MLP residual ->
        next layer's input. Positions are 0 .. T-1.

        Raises
        ------
        ModelError
            ``kind="mlp"`` on a parallel-residual model, where the MLP reads the pre-attention
            state: use ``block(layer)`` or ``branch(layer, "mlp")``.
        """
        self._check_layer(layer)
        self._check_sublayer(kind)
        if kind == "mlp" and self.parallel_residual:
            raise ModelError(
                f"{self.family} uses a parallel residual: its MLP reads the pre-attention state, so "
                f"sublayer({layer}, 'mlp') is not a map of the pre-MLP state; use block({layer}) or "
                f"branch({layer}, 'mlp')."
            )
        f = self.branch(layer, kind)
        return lambda h: h + f(h)

    def block(self, layer: int) -> Callable[[Tensor], Tensor]:
        """The whole decoder layer as a map of its input: (B, T, d) -> (B, T, d)."""
        self._check_layer(layer)
        attn = self.branch(layer, "attn")
        mlp = self.branch(layer, "mlp")
        if self.parallel_residual:
            return lambda h: mlp(h) + attn(h) + h
        return lambda h: (lambda g: g + mlp(g))(h + attn(h))

    def attn_module(self, layer: int) -> nn.Module:
        """The Hugging Face self-attention module of ``layer``."""
        return self._attns[self._check_layer(layer)]

    def out_proj(self, layer: int) -> nn.Module:
        """The attention output projection of ``layer`` (input: head outputs (B, T, H * hd))."""
        return self._oprojs[self._check_layer(layer)]

    def final_norm(self, h_final: Tensor) -> Tensor:
        """The final norm alone: (B, T, d) -> (B, T, d) (what transformers reports as ``hidden_states[L]``)."""
        return self._final_norm_module(h_final)

    def unembed(self, h_final: Tensor) -> Tensor:
        """Final norm, language-model head and any final logit soft-capping: (B, T, d) -> (B, T, V)."""
        logits = self.lm_head(self._final_norm_module(h_final))
        cap = self._final_softcap()
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def composed_logits(self, input_ids: Tensor) -> Tensor:
        """Logits from ``embed`` -> ``block`` for every layer -> ``unembed`` (no gradient)."""
        ids = self._ids(input_ids)
        with torch.no_grad():
            h = self.embed(ids)
            for layer in range(self.n_layers):
                h = self.block(layer)(h)
            return self.unembed(h)

    # ------------------------------------------------------------------ heads

    def head_outputs(self, input_ids: Tensor, layer: int) -> Tensor:
        """Every query head's output before the output projection of ``layer``: (B, T, H, hd).

        Active ablations of that layer are reflected (the capture sees the projection's input).
        """
        ids = self._ids(input_ids)
        self._check_layer(layer)
        out: list[Tensor] = []

        def hook(module: nn.Module, args: tuple) -> None:
            out.append(args[0].detach())
            raise _Stop

        handle = self._oprojs[layer].register_forward_pre_hook(hook)
        try:
            with torch.no_grad(), contextlib.suppress(_Stop):
                self._forward(ids)
        finally:
            handle.remove()
        x = out[0]
        return x.reshape(*x.shape[:2], self.n_heads, self.head_dim)

    @contextlib.contextmanager
    def ablate_head(
        self,
        layer: int,
        head: int | Sequence[int],
        mode: str = "zero",
        value: Tensor | None = None,
    ) -> Iterator[None]:
        """Replace query heads' outputs at the input of ``layer``'s output projection.

        Parameters
        ----------
        layer : int
        head : int or sequence of int
            One head, or several ablated together.
        mode : {"zero", "mean", "resample"}
            ``zero``: set to 0. ``mean``: set to ``value``, the head's mean output vector,
            shape ``(hd,)`` for one head or ``(n, hd)`` for ``n`` heads (e.g. the mean of
            :meth:`head_outputs` over batch and positions). ``resample``: set to ``value`` of
            shape ``(B, T, hd)`` for one head or ``(B, T, n, hd)`` for ``n`` heads (outputs on
            other inputs; ``B`` may be 1 to broadcast).

        The hook acts on every call of the projection: the model's forward pass and the
        :meth:`sublayer` / :meth:`block` maps. It is removed on exit, also after an exception.

        Raises
        ------
        InputError
            For a bad layer, head, mode or value shape (value shapes against the sequence
            length are checked when the hook fires).
        """
        self._check_layer(layer)
        heads = self._check_heads(head)
        single = isinstance(head, int)
        if mode not in ABLATION_MODES:
            raise InputError(f"ablation mode {mode!r} is not one of {ABLATION_MODES}.")
        hd = self.head_dim
        n = len(heads)
        if mode == "zero":
            if value is not None:
                raise InputError("zero ablation takes no value; leave value=None.")
        else:
            if value is None:
                raise InputError(f"{mode} ablation needs a value (see head_outputs).")
            value = torch.as_tensor(value)
            if single:
                value = value.unsqueeze(-2)
            want = (n, hd)
            if mode == "mean" and tuple(value.shape) != want:
                shape = "(hd,)" if single else "(n, hd)"
                raise InputError(f"mean ablation value has shape {tuple(value.shape)}; expected {shape} with hd={hd}.")
            if mode == "resample" and (value.ndim != 4 or tuple(value.shape[-2:]) != want):
                shape = "(B, T, hd)" if single else "(B, T, n, hd)"
                raise InputError(f"resample value has shape {tuple(value.shape)}; expected {shape} with hd={hd}.")
        index = torch.tensor(heads)

        def hook(module: nn.Module, args: tuple) -> tuple:
            x = args[0]
            B, T = x.shape[0], x.shape[1]
            y = x.reshape(B, T, self.n_heads, hd).clone()
            idx = index.to(x.device)
            if mode == "zero":
                y[:, :, idx, :] = 0
            elif mode == "mean":
                y[:, :, idx, :] = value.to(device=x.device, dtype=x.dtype)
            else:
                v = value.to(device=x.device, dtype=x.dtype)
                if v.shape[1] != T or v.shape[0] not in (1, B):
                    raise InputError(
                        f"resample value has shape {tuple(v.shape)}; the input has B={B}, T={T} (B may be 1)."
                    )
                y[:, :, idx, :] = v.expand(B, T, n, hd)
            return (y.reshape(x.shape), *args[1:])

        handle = self._oprojs[layer].register_forward_pre_hook(hook)
        try:
            yield
        finally:
            handle.remove()

    # ------------------------------------------------------------------ clamps

    @contextlib.contextmanager
    def clamp(
        self,
        dims: int | Sequence[int],
        values: float | Tensor | Mapping[int, float | Tensor] | Callable[[int, Tensor], Tensor],
        positions: int | Sequence[int],
        from_layer: int,
    ) -> Iterator[None]:
        """Set residual entries ``h[:, positions, dims] = values`` from ``from_layer`` on.

        The clamp acts in the model's forward pass at the input of every decoder layer
        ``l >= from_layer`` (the pre-attention residual, state ``2l``) and at the input of the
        final norm (state ``2L``), so the final state and the logits are consistent with it.
        Pre-MLP states are not clamped. The pure maps :meth:`sublayer`, :meth:`block` and
        :meth:`unembed` are not affected.

        Parameters
        ----------
        dims : int or sequence of int
            Residual dimensions (D of them).
        values : float, Tensor, mapping or callable
            A scalar or tensor broadcastable to ``(B, P, D)`` used at every clamped layer; a
            mapping ``{layer: value}`` with a value for every layer ``from_layer .. L`` (``L``
            meaning the final-norm input); or a callable ``f(layer, current) -> new`` given the
            current entries ``(B, P, D)`` (e.g. ``lambda l, x: 0.5 * x`` for a dose).
        positions : int or sequence of int
            Token positions (P of them).
        from_layer : int
            First clamped layer, ``0 .. L`` (``L`` clamps only the final state).

        Raises
        ------
        InputError
            For out-of-range dims, positions or layers, or a mapping missing a layer.
        """
        L = self.n_layers
        self._check_layer(from_layer, allow_end=True)
        dim_list = [dims] if isinstance(dims, int) else list(dims)
        pos_list = [positions] if isinstance(positions, int) else list(positions)
        if not dim_list or not pos_list:
            raise InputError("clamp needs at least one dim and one position.")
        for d in dim_list:
            if not 0 <= int(d) < self.d_model:
                raise InputError(f"dim {d} is out of range; the residual has {self.d_model} dims.")
        for p in pos_list:
            if not 0 <= int(p) < self.max_seq_len:
                raise InputError(f"position {p} is out of range 0 .. {self.max_seq_len - 1}.")
        if isinstance(values, Mapping):
            missing = [i for i in range(from_layer, L + 1) if i not in values]
            if missing:
                raise InputError(f"clamp values miss layers {missing}; give one for each of {from_layer} .. {L}.")
        p_idx = torch.tensor(pos_list)[:, None]
        d_idx = torch.tensor(dim_list)[None, :]

        def apply(layer: int, h: Tensor) -> Tensor:
            if max(pos_list) >= h.shape[1]:
                raise InputError(f"clamp position {max(pos_list)} is beyond the sequence length {h.shape[1]}.")
            pi, di = p_idx.to(h.device), d_idx.to(h.device)
            if callable(values) and not isinstance(values, Tensor):
                new = values(layer, h[:, pi, di])
            elif isinstance(values, Mapping):
                new = values[layer]
            else:
                new = values
            h = h.clone()
            h[:, pi, di] = torch.as_tensor(new, dtype=h.dtype, device=h.device)
            return h

        def make(layer: int) -> Callable:
            def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple:
                name = "input" if layer == L else "hidden_states"
                return _replace_first_arg(args, kwargs, apply(layer, _first_arg(args, kwargs, name)), name)

            return hook

        handles = []
        try:
            for i in range(from_layer, L):
                handles.append(self.layers[i].register_forward_pre_hook(make(i), with_kwargs=True))
            handles.append(self._final_norm_module.register_forward_pre_hook(make(L), with_kwargs=True))
            yield
        finally:
            for h in handles:
                h.remove()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(family={self.family!r}, n_layers={self.n_layers}, n_heads={self.n_heads}, "
            f"n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}, d_model={self.d_model})"
        )


def adapter_for(model: nn.Module) -> Adapter:
    """The :class:`Adapter` for ``model``, chosen by :func:`~depthlens.models.families.family_of`.

    Any ``attn_implementation`` works (probabilities are recomputed by the adapter).

    Raises
    ------
    ModelError
        If the model is not a causal LM of a supported family, or its modules do not have
        that family's layout (e.g. remote code, or a base model without an LM head).
    """
    config = getattr(model, "config", None)
    if config is None:
        raise ModelError(f"{type(model).__name__} has no .config; pass a Hugging Face causal LM module.")
    family = family_of(config)
    if family == "llama":
        from .llama import LlamaAdapter as cls
    elif family == "gemma3":
        from .gemma3 import Gemma3Adapter as cls
    elif family == "gpt2":
        from .gpt2 import GPT2Adapter as cls
    elif family == "gpt_neox":
        from .gpt_neox import GPTNeoXAdapter as cls
    else:
        from .olmo import OlmoAdapter as cls
    return cls(model)
