"""One interface to every supported decoder-only architecture.

An :class:`Adapter` wraps a Hugging Face causal LM and exposes it as a dynamical system over
depth. Places in the model are named ``(layer, sublayer, head)`` with ``sublayer`` in
``{"attn", "mlp"}``; layers and heads are 0-based. Only :mod:`depthlens.models` names Hugging
Face modules and configuration fields: the analysis packages reach the model through this
interface.

Residual states
    ``residual_states(ids)[2 * l]`` is the pre-attention residual of layer ``l`` (the input
    of decoder layer ``l``), ``[2 * l + 1]`` the pre-MLP residual of layer ``l`` (after the
    attention sub-layer's skip connection) and ``[2 * L]`` the output of the last layer
    before the final norm. For parallel-residual models (GPT-NeoX / Pythia with
    ``use_parallel_residual``) the pre-MLP state is *defined* as ``h + Attn(ln_1(h))``; the
    model's MLP reads ``ln_2(h)`` of the pre-attention state ``h``, not of this state.
    A family with more residual updates per layer names more boundaries
    (:attr:`Adapter.boundaries`; Gemma 4 adds ``pre_ple``, before its per-layer-input
    update): with ``S`` boundaries a layer, ``[S * l + k]`` is boundary ``k`` of layer ``l``.

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

Attention arithmetic
    :meth:`Adapter.attention_scale`, :meth:`Adapter.attention_softcap`,
    :meth:`Adapter.allowed_positions` (causal / sliding-window mask),
    :meth:`Adapter.rope_cos_sin` and :meth:`Adapter.apply_rope` (rotary position embeddings
    as the model computes them) say how scores are formed; :meth:`Adapter.layer_weights`
    gives a layer's weights, norms and q/k norms in one shape for every family
    (:class:`~depthlens.models.weights.LayerWeights`).

Attention probabilities (:mod:`depthlens.models.hooks`)
    Recomputed in float64 from the pre-softmax scores: the attention module's input is
    captured during one forward pass, queries and keys are formed exactly as the model does
    (projections, q/k norms and RoPE in the model dtype), then cast to float64 for the
    scaled scores, soft-capping, causal / sliding-window mask and softmax. Masked entries
    are exact zeros; every row sums to one. Each query head has its own matrix (grouped
    key/value heads are repeated).

Interventions (:mod:`depthlens.models.interventions`; context managers that always remove themselves)
    ``ablate_head`` replaces query-head outputs at the input of the attention output
    projection; ``clamp`` overwrites residual entries at the input of decoder layers
    ``>= from_layer`` and at the input of the final norm.

Inputs are token ids ``(B, T)`` (or ``(T,)``, read as ``B = 1``) without padding; the
adapter never adds a BOS token (see :meth:`Adapter.prepend_bos`).
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from ..errors import InputError, ModelError
from .checks import Checks
from .hooks import Captures
from .interventions import Interventions
from .registry import family_for_config, text_config
from .weights import LayerWeights, WeightReader

__all__ = ["SUBLAYERS", "Adapter", "Sublayer", "adapter_for", "check_sublayer"]

Sublayer = Literal["attn", "mlp", "ple"]
#: Every sub-layer kind, in the order they act inside a layer: attention, MLP, and the
#: per-layer-input update of the families that have one (Gemma 4); :attr:`Adapter.sublayers`
#: names a model's own.
SUBLAYERS: tuple[Sublayer, ...] = ("attn", "mlp", "ple")


def check_sublayer(kind: str) -> Sublayer:
    """``kind`` if it is one of :data:`SUBLAYERS`, else :class:`~depthlens.errors.InputError`
    (:meth:`Adapter.check_kind` also checks that the model has it)."""
    if kind not in SUBLAYERS:
        raise InputError(f"sublayer {kind!r} is not one of {SUBLAYERS}.")
    return kind  # type: ignore[return-value]


def _repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """(B, KV, T, d) -> (B, KV * n_rep, T, d); query head j reads key/value head j // n_rep."""
    return x if n_rep == 1 else torch.repeat_interleave(x, n_rep, dim=1)


class Adapter(Captures, Interventions, Checks, ABC):
    """A causal LM seen as a stack of sub-layer maps (abstract; one subclass per family).

    Attributes
    ----------
    model : torch.nn.Module
        The wrapped ``*ForCausalLM`` module (put in eval mode).
    config : transformers.PretrainedConfig
        The language model's configuration (the text configuration of multimodal models).
    family : str
        The family name (see :func:`depthlens.models.registry.families`).
    layers : sequence of torch.nn.Module
        The decoder layers, in order.
    n_layers, n_heads, n_kv_heads, head_dim, d_model, max_seq_len, vocab_size : int
        Shape of the model (``n_heads`` query heads per layer).
    bos_token_id : int or None
        From the configuration; None when the configuration has none.
    sliding_windows : list of (int or None)
        Per layer, the number of keys a query sees (itself included) or None for full causal
        attention: a query at position i attends to j with ``i - W < j <= i``.
    parallel_residual : bool
        True when attention and MLP read the same residual (GPT-NeoX / Pythia).
    has_rope : bool
        True when queries and keys carry rotary position embeddings (:meth:`rope_cos_sin`).
    boundaries : tuple of str
        The residual states of one layer, in order (:meth:`residual_states`): ``pre_attn``
        and ``pre_mlp``, and more where the family's layer updates the residual more often.
    block_maps : bool
        Whether :meth:`block` maps a layer's input to its output alone, so that a pass may
        start at any layer (False for Gemma 4, whose layers also read per-layer inputs and
        keys shared from earlier layers: passes run the model's own forward pass).

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

    block_maps: ClassVar[bool] = True

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.config = text_config(model.config)
        self.family: str = family_for_config(model.config).name
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
        self.n_kv_heads: int = int(self._n_kv_heads())
        self.head_dim: int = int(self._head_dim())
        self.d_model: int = int(cfg.hidden_size)
        self.max_seq_len: int = int(cfg.max_position_embeddings)
        self.vocab_size: int = int(cfg.vocab_size)
        bos = getattr(cfg, "bos_token_id", None)
        if bos is None:
            bos = getattr(model.config, "bos_token_id", None)
        self.bos_token_id: int | None = None if bos is None else int(bos)
        self.sliding_windows: list[int | None] = [self._sliding_window(i) for i in range(self.n_layers)]
        self.parallel_residual: bool = bool(self._parallel_residual())
        if self.n_heads % self.n_kv_heads:
            raise ModelError(f"{self.n_heads} query heads are not a multiple of {self.n_kv_heads} key/value heads.")
        self._rope = getattr(self.backbone, "rotary_emb", None)
        self._rotary_fn = getattr(sys.modules[type(self._attns[0]).__module__], "apply_rotary_pos_emb", None)
        self.has_rope: bool = self._rope is not None and self._rotary_fn is not None
        self.boundaries: tuple[str, ...] = ("pre_attn", "pre_mlp", *self._extra_boundaries())
        #: The :class:`~depthlens.models.streaming.Streamer` of a layer-streamed model, else None.
        self.streamer: Any = None

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
    def qkv(self, layer: int, x: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Queries (B, H, T, hd), keys and values (B, KV, T, hd) from the attention module's input.

        ``x`` is what the model feeds its attention module (already normed for pre-norm
        families); q/k norms and rotary position embeddings (positions 0 .. T-1) are
        applied exactly as in the model, in the model dtype. Keys and values are None for a
        layer that attends with another layer's (:meth:`kv_source`).
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

    @abstractmethod
    def _layer_weights(self, layer: int, read: WeightReader) -> LayerWeights:
        """The weights of decoder layer ``layer``, read with ``read`` (see :meth:`layer_weights`)."""

    def _n_kv_heads(self) -> int:
        return getattr(self.config, "num_key_value_heads", None) or self.n_heads

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

    def _extra_boundaries(self) -> tuple[str, ...]:
        """Boundaries of a layer after its pre-MLP residual (:meth:`_extra_boundary_module`)."""
        return ()

    def _extra_boundary_module(self, layer: int, boundary: str) -> nn.Module:
        """A module whose first input is the residual at extra boundary ``boundary`` of ``layer``."""
        raise ModelError(f"{self.family} has no boundary {boundary!r}.")

    def layer_head_dim(self, layer: int) -> int:
        """The width of one head of ``layer`` (:attr:`head_dim` unless the family's layers differ)."""
        return self.head_dim

    def layer_kv_heads(self, layer: int) -> int:
        """The key/value heads of ``layer`` (:attr:`n_kv_heads` unless the family's layers differ)."""
        return self.n_kv_heads

    @property
    def sublayers(self) -> tuple[Sublayer, ...]:
        """The sub-layers of a layer, in order, one per boundary of :attr:`boundaries` (the one
        it reads): ``("attn", "mlp")``, and ``"ple"`` where the family's layers add a
        per-layer-input update (``pre_ple``)."""
        return tuple(boundary.removeprefix("pre_") for boundary in self.boundaries)  # type: ignore[return-value]

    def check_kind(self, kind: str) -> Sublayer:
        """``kind`` if this model's layers have that sub-layer, else a one-line :class:`InputError`."""
        if check_sublayer(kind) not in self.sublayers:
            raise InputError(f"{self.family} layers have no {kind!r} sub-layer; they have {self.sublayers}.")
        return kind  # type: ignore[return-value]

    @property
    def per_layer_width(self) -> int:
        """The width ``dp`` of :meth:`per_layer_inputs` (0 where the family has none)."""
        return 0

    def per_layer_inputs(self, input_ids: Tensor) -> Tensor | None:
        """What each layer reads besides the residual, per token: ``(B, T, L, dp)`` (Gemma 4's
        per-layer inputs, fed to the layers' ``ple`` sub-layer), or None where the family has none."""
        return None

    def kv_source(self, layer: int) -> int:
        """The layer whose keys and values ``layer`` attends with: itself, or an earlier one where
        a family shares them (Gemma 4), whose :meth:`qkv` then gives None for keys and values."""
        return layer

    # ------------------------------------------------------------------ attention arithmetic

    def attention_scale(self, layer: int) -> float:
        """The factor multiplying ``q . k`` in the scores of ``layer`` (e.g. ``head_dim ** -0.5``)."""
        return float(self._attns[self.check_layer(layer)].scaling)

    def attention_softcap(self, layer: int) -> float | None:
        """The tanh soft-cap ``c`` of ``layer``'s scores (``s -> c tanh(s / c)``), or None.

        No current family applies one: Gemma 3's modeling code keeps ``attn_logit_softcapping``
        in its configuration but never passes it on.
        """
        return None

    def logit_softcap(self) -> float | None:
        """The tanh soft-cap of the output logits (``final_logit_softcapping``), or None."""
        cap = getattr(self.config, "final_logit_softcapping", None)
        return None if cap is None else float(cap)

    def allowed_positions(self, layer: int, T: int, device: torch.device | str | None = None) -> Tensor:
        """Boolean ``(T, T)``: query ``i`` may attend to key ``j`` in ``layer`` (causal, sliding window)."""
        i = torch.arange(T, device=device)[:, None]
        j = torch.arange(T, device=device)[None, :]
        ok = j <= i
        w = self.sliding_windows[self.check_layer(layer)]
        if w is not None:
            ok = ok & (i - j < w)
        return ok

    def rope_cos_sin(self, layer: int, T: int, like: Tensor) -> tuple[Tensor, Tensor]:
        """``(cos, sin)`` of the rotary embedding at positions ``0 .. T-1``, from the model's rotary module.

        Shapes ``(1, T, rot)`` with ``rot`` the rotated width of a head (all of it, or the
        partial-rotary fraction); dtype and device of ``like`` (angles computed in float32
        from the model's own ``inv_freq``). Layers with their own RoPE base (Gemma 3's and
        OLMo 3's sliding layers) get theirs.

        Raises
        ------
        ModelError
            If the model has no rotary embedding (:attr:`has_rope` is False).
        """
        if not self.has_rope:
            raise ModelError(f"{self.family} has no rotary position embedding.")
        pos = torch.arange(T, device=like.device).unsqueeze(0)
        dummy = torch.empty(0, dtype=like.dtype, device=like.device)
        types = getattr(self.config, "layer_types", None)
        if types is not None and isinstance(getattr(self._rope, "rope_type", None), dict):  # per-layer-type RoPE
            return self._rope(dummy, pos, types[layer])
        return self._rope(dummy, pos)

    def apply_rope(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """Rotate queries ``(B, H, T, hd)`` and keys ``(B, KV, T, hd)`` by ``(cos, sin)`` (:meth:`rope_cos_sin`).

        The model's own ``apply_rotary_pos_emb`` (partial rotary: only the first ``rot``
        dims of each head turn). It is linear in ``q`` and ``k``.

        Raises
        ------
        ModelError
            If the model has no rotary embedding.
        """
        if not self.has_rope:
            raise ModelError(f"{self.family} has no rotary position embedding.")
        return self._rotary_fn(q, k, cos, sin)

    def layer_weights(
        self, layer: int, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
    ) -> LayerWeights:
        """Copies of decoder layer ``layer``'s weights in ``dtype`` on ``device``, in the family-free form.

        A :class:`~depthlens.models.weights.LayerWeights`: pre- and post-norms of both
        sub-layers, q/k norms (per head or over the full projection), the projections as
        ``(out, in)`` matrices with their biases, and the MLP (gated or not) with the model's
        activation module. Nothing is cached; each call copies the layer's parameters
        (``itemsize x`` their count in memory).

        Parameters
        ----------
        layer : int
        dtype : torch.dtype
            Arithmetic dtype of the copies (float64 by default).
        device : torch.device or str, optional
            Default: the model's device.

        Raises
        ------
        InputError
            For a bad layer.
        ModelError
            If a module of the layer has an unexpected type, or a q/k norm an unexpected width.
        """
        self.check_layer(layer)
        if self.streamer is not None:
            self.streamer.ensure(layer)
        read = WeightReader(dtype, self.device if device is None else torch.device(device))
        with torch.no_grad():
            w = self._layer_weights(layer, read)
        H, KV, hd = self.n_heads, self.layer_kv_heads(layer), self.layer_head_dim(layer)
        q_width, k_width = (hd, hd) if w.qk_per_head else (H * hd, KV * hd)
        for norm, size, what in ((w.q_norm, q_width, "q"), (w.k_norm, k_width, "k")):
            if norm is not None and norm.size != size:
                raise ModelError(f"{self.family} layer {layer}: {what} norm has width {norm.size}, expected {size}.")
        return w

    # ------------------------------------------------------------------ helpers

    @property
    def device(self) -> torch.device:
        """The device of the model's parameters (those held in memory, for a streamed model)."""
        return self._held_parameter().device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the model's parameters (those held in memory, for a streamed model)."""
        return self._held_parameter().dtype

    def _held_parameter(self) -> nn.Parameter:
        """The first parameter that is not on ``meta`` (a streamed model's released layers are)."""
        return next(p for p in self.model.parameters() if not p.is_meta)

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
        n_rep = self.n_heads // self.layer_kv_heads(layer)
        k = _repeat_kv(k, n_rep)
        v = _repeat_kv(v, n_rep)
        T = q.shape[-2]
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.attention_scale(layer)
        cap = self.attention_softcap(layer)
        if cap is not None:
            scores = torch.tanh(scores / cap) * cap
        mask = torch.zeros((T, T), dtype=scores.dtype, device=scores.device)
        mask = mask.masked_fill(~self.allowed_positions(layer, T, scores.device), torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores + mask, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2)
        return out.reshape(*out.shape[:2], -1)

    def probs_from_qk(self, layer: int, q: Tensor, k: Tensor) -> Tensor:
        """Float64 attention probabilities (B, H, T, T) from queries (B, H, T, hd) and keys (B, KV, T, hd)."""
        q64 = q.to(torch.float64)
        k64 = _repeat_kv(k, self.n_heads // self.layer_kv_heads(layer)).to(torch.float64)
        scores = torch.matmul(q64, k64.transpose(-1, -2)) * self.attention_scale(layer)
        cap = self.attention_softcap(layer)
        if cap is not None:
            scores = torch.tanh(scores / cap) * cap
        T = q.shape[-2]
        scores = scores.masked_fill(~self.allowed_positions(layer, T, scores.device), float("-inf"))
        return torch.softmax(scores, dim=-1)

    def logits(self, input_ids: Tensor) -> Tensor:
        """The model's own logits (B, T, V) (no gradient)."""
        ids = self._ids(input_ids)
        with torch.no_grad():
            return self._forward(ids).logits

    # ------------------------------------------------------------------ sub-layer maps

    def branch(self, layer: int, kind: Sublayer) -> Callable[[Tensor], Tensor]:
        """What sub-layer ``kind`` of ``layer`` adds to the residual, as a function of the residual it reads.

        ``branch(l, "attn")``: ``h -> post(Attn(norm(h)))``; ``branch(l, "mlp")``:
        ``g -> post(MLP(norm(g)))``. For parallel-residual models the MLP branch reads the
        pre-attention state ``h`` (so ``block(l)(h) = h + branch(l, "attn")(h) + branch(l, "mlp")(h)``).
        """
        self.check_layer(layer)
        check_sublayer(kind)
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
        self.check_layer(layer)
        check_sublayer(kind)
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
        self.check_layer(layer)
        attn = self.branch(layer, "attn")
        mlp = self.branch(layer, "mlp")
        if self.parallel_residual:
            return lambda h: mlp(h) + attn(h) + h
        return lambda h: (lambda g: g + mlp(g))(h + attn(h))

    def attn_module(self, layer: int) -> nn.Module:
        """The Hugging Face self-attention module of ``layer``."""
        return self._attns[self.check_layer(layer)]

    def out_proj(self, layer: int) -> nn.Module:
        """The attention output projection of ``layer`` (input: head outputs (B, T, H * hd))."""
        return self._oprojs[self.check_layer(layer)]

    def final_norm(self, h_final: Tensor) -> Tensor:
        """The final norm alone: (B, T, d) -> (B, T, d) (what transformers reports as ``hidden_states[L]``)."""
        return self._final_norm_module(h_final)

    def unembed(self, h_final: Tensor) -> Tensor:
        """Final norm, language-model head and any final logit soft-capping: (B, T, d) -> (B, T, V)."""
        logits = self.lm_head(self._final_norm_module(h_final))
        cap = self.logit_softcap()
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

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(family={self.family!r}, n_layers={self.n_layers}, n_heads={self.n_heads}, "
            f"n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}, d_model={self.d_model})"
        )


def adapter_for(model: nn.Module) -> Adapter:
    """The :class:`Adapter` for ``model``: the adapter class of its :class:`~depthlens.models.registry.Family`.

    Any ``attn_implementation`` works (probabilities are recomputed by the adapter).

    Raises
    ------
    ModelError
        If the model has no configuration, is not a causal LM of a registered family (an
        unknown ``model_type`` is refused, never given a default adapter), or its modules do
        not have that family's layout (e.g. remote code, or a base model without an LM head).
    """
    config = getattr(model, "config", None)
    if config is None:
        raise ModelError(f"{type(model).__name__} has no .config; pass a Hugging Face causal LM module.")
    return family_for_config(config).adapter(model)
