"""Captures: what one forward pass of the model computes, read by hooks that remove themselves.

:class:`Captures` is mixed into :class:`~depthlens.models.adapter.Adapter` and gives it
:meth:`~Captures.attention_inputs`, :meth:`~Captures.attention_probs` (recomputed in float64
from the captured attention inputs; :meth:`~Captures.qk_captures` keeps what they are formed
from, :meth:`~Captures.probs_from_captures` forms them again), :meth:`~Captures.residual_states`,
:meth:`~Captures.final_state`, :meth:`~Captures.head_outputs` and
:meth:`~Captures.each_head_output`, and :meth:`~Captures.layer_offsets` (the one that keeps
gradients). Every other capture runs under ``torch.no_grad()`` and returns detached tensors;
each stops the forward pass once it has what it needs where it can, and removes its hooks on
the way out, also after an exception (:meth:`~Captures._hooked`). Active ablations and clamps
(:mod:`depthlens.models.interventions`) act on the captured forward pass.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import InputError, ModelError

__all__ = ["SHARED_BYTES", "Captures"]

#: Bytes of forward-pass results a :meth:`Captures.shared_passes` block keeps by default (the
#: residual states of SmolLM2's 32 chunks of 128 tokens take 575 MB, their queries and keys 47 MB).
SHARED_BYTES = 1 << 30


class _Stop(Exception):
    """Raised inside a hook to end a forward pass early once everything needed is captured."""


def _copied(value: Any) -> Any:
    """A copy of every tensor of ``value`` (a tensor, or dicts and tuples of tensors and None)."""
    if isinstance(value, Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_copied(v) for v in value)
    return value


def _nbytes(value: Any) -> int:
    if isinstance(value, Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    if isinstance(value, tuple):
        return sum(_nbytes(v) for v in value)
    return 0


class _Passes:
    """The forward-pass results an open :meth:`Captures.shared_passes` block keeps."""

    def __init__(self, budget: int, rows: Tensor | None) -> None:
        self.budget = int(budget)
        self.rows = None if rows is None else {r.tobytes() for r in rows.cpu().numpy()}
        self.kept: dict[tuple, Any] = {}

    def keep(self, key: tuple, ids: Tensor, value: Any) -> None:
        """Keep a copy of ``value`` if its ``ids`` are rows of the block's ``rows`` and it fits the budget."""
        if self.rows is not None and not all(r.tobytes() in self.rows for r in ids.cpu().numpy()):
            return
        size = _nbytes(value)
        if size <= self.budget:
            self.kept[key] = _copied(value)
            self.budget -= size


def first_arg(args: tuple, kwargs: dict, name: str = "hidden_states") -> Tensor:
    """The first input of a hooked module, passed positionally or as ``name``.

    Raises
    ------
    ModelError
        If the module received neither.
    """
    if args:
        return args[0]
    if name in kwargs:
        return kwargs[name]
    raise ModelError(f"could not find the {name} argument of a hooked module; the model layout is unexpected.")


def replace_first_arg(args: tuple, kwargs: dict, value: Tensor, name: str = "hidden_states") -> tuple:
    """``(args, kwargs)`` with the first input (see :func:`first_arg`) replaced by ``value``."""
    if args:
        return (value, *args[1:]), kwargs
    kwargs = dict(kwargs)
    kwargs[name] = value
    return args, kwargs


class Captures:
    """Forward-pass captures of an :class:`~depthlens.models.adapter.Adapter` (a mixin of it).

    Hooks the adapter's decoder layers, attention modules, output projections and final norm
    (``layers``, ``_attns``, ``_oprojs``, ``_final_norm_module``) and the module its family
    names with ``_pre_mlp_module``.
    """

    #: The open :meth:`shared_passes` block's results (None: no block).
    _passes: _Passes | None = None

    @contextlib.contextmanager
    def shared_passes(self, budget: int = SHARED_BYTES, rows: Tensor | None = None) -> Iterator[None]:
        """Within the block, :meth:`residual_states` and the query/key captures
        (:meth:`qk_captures`, :meth:`attention_probs`) keep what each forward pass gives while
        ``budget`` bytes allow, and answer a later request for the same ids (and layers) with a
        copy of it, bit for bit what that request would compute, without a forward pass.

        For work that reads the same chunks several times, e.g. the stages of one run
        (:func:`depthlens.workflow.run`). Blocks nest: one opened inside another on the same
        adapter is the outer one (its budget, what it kept). Everything kept is dropped on exit.
        Passes under an ablation or clamp of this adapter (:mod:`~depthlens.models.interventions`)
        are neither kept nor answered; hooks of your own are not seen, so open no block around
        passes under them.

        Parameters
        ----------
        budget : int
            Bytes kept at most (each result is kept whole or not at all; 0 keeps nothing).
        rows : Tensor (N, T), optional
            Keep only passes whose every sequence is a row of ``rows`` (e.g. a run's chunks,
            not probe sequences). Default: any.
        """
        if self._passes is not None:
            yield
            return
        self._passes = _Passes(budget, rows)
        try:
            yield
        finally:
            self._passes = None

    def _shared(self, kind: tuple, ids: Tensor, compute: Callable[[], Any]) -> Any:
        """``compute()``, or a copy of what it gave for the same ``kind`` and ids inside the open block."""
        key = self._key(kind, ids)
        found = self._kept(key)
        if found is not None:
            return found
        value = compute()
        self._keep(key, ids, value)
        return value

    def _key(self, kind: tuple, ids: Tensor) -> tuple | None:
        """The key of a pass inside the open block, None without one or under an intervention."""
        if self._passes is None or getattr(self, "_active", 0):
            return None
        return (*kind, str(ids.dtype), tuple(ids.shape), ids.cpu().numpy().tobytes())

    def _kept(self, key: tuple | None) -> Any:
        """A copy of what the open block kept under ``key`` (:meth:`_key`), or None."""
        kept = None if key is None else self._passes.kept.get(key)  # type: ignore[union-attr]
        return None if kept is None else _copied(kept)

    def _keep(self, key: tuple | None, ids: Tensor, value: Any) -> None:
        if key is not None:
            self._passes.keep(key, ids, value)  # type: ignore[union-attr]

    @contextlib.contextmanager
    def _hooked(self, ids: Tensor, grad: bool = False, output: dict | None = None) -> Iterator[list]:
        """Yield a list for the hook handles the body registers, then run one forward pass on
        ``ids`` (without gradients unless ``grad``; a hook's :class:`_Stop` ends it quietly;
        its output goes to ``output["output"]`` when ``output`` is given) and remove every
        handle, also after an exception in the body or the pass."""
        handles: list = []
        try:
            yield handles
            with torch.enable_grad() if grad else torch.no_grad(), contextlib.suppress(_Stop):
                result = self._forward(ids)
                if output is not None:
                    output["output"] = result
        finally:
            for handle in handles:
                handle.remove()

    def attention_probs(
        self, input_ids: Tensor, layers: int | Iterable[int] | None = None
    ) -> Iterator[tuple[int, Tensor]]:
        """Yield ``(layer, A)`` with ``A`` the float64 attention probabilities (B, H, T, T).

        One forward pass captures the attention inputs of the requested layers (it stops
        after the last of them); the float64 matrices are then formed one layer at a time,
        so only one layer's matrices are alive at once. Active ablations and clamps act on
        that forward pass, so the probabilities of later layers reflect them. The same as
        :meth:`probs_from_captures` of :meth:`qk_captures`.

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
        ids, wanted = self._ids(input_ids), self._wanted_layers(layers)
        return self._probs(self._qk_captures(ids, wanted), wanted)

    def qk_captures(self, input_ids: Tensor, layers: int | Iterable[int] | None = None) -> dict[int, Any]:
        """What :meth:`attention_probs` forms the matrices of ``layers`` (default all) from: the
        queries of those layers and the keys of the layers they read (:meth:`kv_source`), in
        the model dtype and on its device, from one forward pass that stops after the last of
        them. Keep it to form the matrices again (:meth:`probs_from_captures`) without another
        forward pass: about ``(H + KV)·T·hd`` values a layer and sequence.

        Raises
        ------
        InputError
            For bad ids or layer indices.
        """
        ids = self._ids(input_ids)
        return self._qk_captures(ids, self._wanted_layers(layers))

    def probs_from_captures(self, captured: dict[int, Any],
                            layers: int | Iterable[int] | None = None) -> Iterator[tuple[int, Tensor]]:
        """Yield ``(layer, A)`` for ``layers`` (default all; each captured by ``captured``, a
        :meth:`qk_captures` result) as :meth:`attention_probs` yields them from the same pass,
        bit for bit, one layer at a time.

        Raises
        ------
        InputError
            For a layer index out of range or not captured.
        """
        wanted = self._wanted_layers(layers)
        for layer in wanted:
            if layer not in captured or captured[layer][0] is None:
                raise InputError(f"layer {layer}'s queries were not captured; pass it to qk_captures.")
        return self._probs(captured, wanted)

    def _wanted_layers(self, layers: int | Iterable[int] | None) -> list[int]:
        """``layers`` as a list (default every layer), each checked."""
        if layers is None:
            return list(range(self.n_layers))
        wanted = [layers] if isinstance(layers, int) else list(layers)
        for layer in wanted:
            self.check_layer(layer)
        return wanted

    def logits_and_attention_probs(self, input_ids: Tensor,
                                   layers: Iterable[int]) -> tuple[Tensor, Iterator[tuple[int, Tensor]]]:
        """The model's own logits (B, T, V) and, from the same (whole) forward pass, the float64
        attention probabilities of ``layers`` as :meth:`attention_probs` yields them (active
        ablations and clamps act on that pass). The probabilities are formed one layer at a
        time as the iterator is read."""
        ids = self._ids(input_ids)
        wanted = [self.check_layer(layer) for layer in layers]
        output: dict = {}
        captured = self._qk_captures(ids, wanted, output)
        return output["output"].logits, self._probs(captured, wanted)

    def _qk_captures(self, ids: Tensor, wanted: list[int], output: dict | None = None) -> dict[int, Any]:
        """Queries of the ``wanted`` layers and keys of the layers they read (:meth:`kv_source`),
        formed during one forward pass while each layer's weights are in memory (a streamed
        model holds one layer at a time); the pass stops after the last of them unless its
        ``output`` is wanted."""
        hooked, keep = self._qk_keeper(wanted)
        if output is not None:  # a whole pass for its logits: not shared
            return self._attention_captures(ids, hooked, keep, output)
        return self._shared(("qk", tuple(sorted(set(wanted)))), ids, lambda: self._attention_captures(ids, hooked, keep))

    def _qk_keeper(self, wanted: Iterable[int]) -> tuple[set[int], Callable[[int, Tensor], tuple]]:
        """The layers whose attention inputs the captures of ``wanted`` read (``wanted`` and the
        layers whose keys they read, :meth:`kv_source`) and what is kept of each input ``x``:
        ``(q, k)``, q only for ``wanted``, k only for the key sources."""
        wanted = set(wanted)
        sources = {self.kv_source(layer) for layer in wanted}

        def keep(layer: int, x: Tensor) -> tuple[Tensor | None, Tensor | None]:
            q, k, _ = self.qkv(layer, x)
            return (q if layer in wanted else None), (k if layer in sources else None)

        return wanted | sources, keep

    def states_and_captures(self, input_ids: Tensor) -> tuple[Tensor, dict[int, Any]]:
        """:meth:`residual_states` and :meth:`qk_captures` of every layer from one forward pass,
        each bit for bit what its own pass gives (inside :meth:`shared_passes` each is kept and
        answered as if asked for alone).

        Raises
        ------
        InputError
            For bad ids.
        """
        ids = self._ids(input_ids)
        keys = [self._key(kind, ids) for kind in (("residual_states",), ("qk", tuple(range(self.n_layers))))]
        found = [self._kept(key) for key in keys]
        if found[0] is not None and found[1] is not None:
            return found[0], found[1]
        captured: dict[int, Any] = {}
        states = self._residual_states(ids, captured)
        for key, value in zip(keys, (states, captured)):
            self._keep(key, ids, value)
        return states, captured

    def _probs(self, captured: dict[int, Any], wanted: list[int]) -> Iterator[tuple[int, Tensor]]:
        for layer in wanted:
            q, k = captured[layer][0], captured[self.kv_source(layer)][1]
            with torch.no_grad():  # closed before the yield: a consumer stopped there keeps its grad mode
                probs = self.probs_from_qk(layer, q, k)
            yield layer, probs

    def attention_inputs(self, input_ids: Tensor, layers: Iterable[int] | None = None) -> dict[int, Tensor]:
        """The inputs of the attention modules of ``layers`` (B, T, d), from one (early-stopped) forward pass."""
        ids = self._ids(input_ids)
        wanted = set(range(self.n_layers)) if layers is None else {self.check_layer(i) for i in layers}
        return self._attention_captures(ids, wanted, lambda layer, x: x)

    def _attention_captures(self, ids: Tensor, wanted: set[int], keep: Callable[[int, Tensor], Any],
                            output: dict | None = None) -> dict[int, Any]:
        """``keep(layer, x)`` of the attention inputs ``x`` of the ``wanted`` layers, each taken
        during one forward pass that stops after the last of them (that runs to the end, its
        output in ``output["output"]``, when ``output`` is given)."""
        if not wanted and output is None:
            return {}
        captured: dict[int, Any] = {}
        with self._hooked(ids, output=output) as handles:
            self._register_captures(handles, wanted, keep, captured, max(wanted) if output is None and wanted else -1)
        return captured

    def _register_captures(self, handles: list, wanted: Iterable[int], keep: Callable[[int, Tensor], Any],
                           captured: dict[int, Any], last: int = -1) -> None:
        """Pre-hooks (appended to ``handles``) that put ``keep(layer, x)`` of the attention input
        ``x`` of each ``wanted`` layer in ``captured``; the one of layer ``last`` ends the pass."""
        def make(i: int) -> Callable:
            def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
                captured[i] = keep(i, first_arg(args, kwargs).detach())
                if i == last:
                    raise _Stop

            return hook

        for i in wanted:
            handles.append(self._attns[i].register_forward_pre_hook(make(i), with_kwargs=True))

    def residual_states(self, input_ids: Tensor) -> Tensor:
        """The residual stream ``(S·L + 1, B, T, d)`` in the model dtype (``S`` boundaries a
        layer, :attr:`boundaries`; 2 but for Gemma 4's 3), from one forward pass that stops
        at the final norm (no logits are formed).

        Index ``S·l`` is the input of layer ``l``, ``S·l + 1`` its pre-MLP residual (for
        parallel residual models ``h + Attn(ln_1(h))``), ``S·l + k`` its further boundaries,
        ``S·L`` the last layer's output before the final norm. Active clamps and ablations are
        reflected. Inside :meth:`shared_passes`, a batch computed before is a copy of it.
        """
        ids = self._ids(input_ids)
        return self._shared(("residual_states",), ids, lambda: self._residual_states(ids))

    def _residual_states(self, ids: Tensor, captured: dict[int, Any] | None = None) -> Tensor:
        """The residual states of one pass; with ``captured``, the queries and keys of every layer
        go there too (:meth:`states_and_captures`)."""
        L, S = self.n_layers, len(self.boundaries)
        states: list[Tensor | None] = [None] * (S * L + 1)

        def pre(index: int) -> Callable:
            def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
                states[index] = first_arg(args, kwargs).detach()

            return hook

        def attn_out(i: int) -> Callable:
            def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
                a = output[0] if isinstance(output, tuple) else output
                states[S * i + 1] = states[S * i] + a.detach()

            return hook

        def final(module: nn.Module, args: tuple, kwargs: dict) -> None:
            states[S * L] = first_arg(args, kwargs, "input").detach()
            raise _Stop  # the final norm and the unembedding read nothing kept here

        with self._hooked(ids) as handles:
            for i, layer in enumerate(self.layers):
                handles.append(layer.register_forward_pre_hook(pre(S * i), with_kwargs=True))
                mod = self._pre_mlp_module(i)
                if mod is None:
                    handles.append(self._attns[i].register_forward_hook(attn_out(i), with_kwargs=True))
                else:
                    handles.append(mod.register_forward_pre_hook(pre(S * i + 1), with_kwargs=True))
                for k, boundary in enumerate(self.boundaries[2:], start=2):
                    module = self._extra_boundary_module(i, boundary)
                    handles.append(module.register_forward_pre_hook(pre(S * i + k), with_kwargs=True))
            handles.append(self._final_norm_module.register_forward_pre_hook(final, with_kwargs=True))
            if captured is not None:
                self._register_captures(handles, *self._qk_keeper(range(L)), captured)
        missing = [i for i, s in enumerate(states) if s is None]
        if missing:
            raise ModelError(f"residual states {missing} were not seen in the forward pass; the layout is unexpected.")
        return torch.stack(states)  # type: ignore[arg-type]

    def layer_offsets(self, input_ids: Tensor) -> tuple[Tensor, list[Tensor]]:
        """The model's own forward pass with a zero offset added to every decoder layer's
        output: ``(h_final, offsets)``.

        ``h_final`` (B, T, d) is the last layer's output before the final norm (the pass stops
        there: no logits are formed); ``offsets[l]`` is the zero tensor, with
        ``requires_grad``, added to layer ``l``'s output. The gradient of anything computed
        from ``h_final`` with respect to ``offsets[l]`` is therefore its gradient with respect
        to layer ``l``'s output through every path of the model's own computation: later
        layers, and also keys and values that later layers share and per-layer inputs (Gemma 4).
        Runs with gradients enabled, in the model's dtype; active ablations and clamps act.
        """
        ids = self._ids(input_ids)
        offsets: list[Tensor | None] = [None] * self.n_layers
        final: list[Tensor] = []

        def after(i: int) -> Callable:
            def hook(module: nn.Module, args: tuple, output: Any) -> Any:
                out = output[0] if isinstance(output, tuple) else output
                offsets[i] = torch.zeros_like(out, requires_grad=True)
                moved = out + offsets[i]
                return (moved, *output[1:]) if isinstance(output, tuple) else moved

            return hook

        def stop(module: nn.Module, args: tuple, kwargs: dict) -> None:
            final.append(first_arg(args, kwargs, "input"))
            raise _Stop

        with self._hooked(ids, grad=True) as handles:
            for i, layer in enumerate(self.layers):
                handles.append(layer.register_forward_hook(after(i)))
            handles.append(self._final_norm_module.register_forward_pre_hook(stop, with_kwargs=True))
        if not final or any(o is None for o in offsets):
            raise ModelError("the forward pass did not pass every decoder layer and the final norm; the layout is "
                             "unexpected.")
        return final[0], offsets  # type: ignore[return-value]

    def final_state(self, input_ids: Tensor) -> Tensor:
        """The last layer's output ``(B, T, d)`` before the final norm, in the model dtype, from
        the model's own forward pass (which stops there: no logits are formed). Active
        ablations and clamps act."""
        ids = self._ids(input_ids)
        out: list[Tensor] = []

        def stop(module: nn.Module, args: tuple, kwargs: dict) -> None:
            out.append(first_arg(args, kwargs, "input").detach())
            raise _Stop

        with self._hooked(ids) as handles:
            handles.append(self._final_norm_module.register_forward_pre_hook(stop, with_kwargs=True))
        return out[0]

    def each_head_output(self, input_ids: Tensor, last: int, on_output: Callable[[int, Tensor], None]) -> None:
        """Call ``on_output(layer, x)`` with every output projection's input ``x`` (B, T, H·hd)
        of layers ``0 … last``, in the model's own forward pass (which stops after ``last``'s)."""
        ids = self._ids(input_ids)

        def make(layer: int) -> Callable:
            def hook(module: nn.Module, args: tuple) -> None:
                on_output(layer, args[0].detach())
                if layer == last:
                    raise _Stop

            return hook

        with self._hooked(ids) as handles:
            handles.extend(self._oprojs[k].register_forward_pre_hook(make(k)) for k in range(last + 1))

    def head_outputs(self, input_ids: Tensor, layer: int) -> Tensor:
        """Every query head's output before the output projection of ``layer``: (B, T, H, hd).

        Active ablations of that layer are reflected (the capture sees the projection's input).
        """
        self.check_layer(layer)
        out: dict[int, Tensor] = {}
        self.each_head_output(input_ids, layer, out.__setitem__)
        x = out[layer]
        return x.reshape(*x.shape[:2], self.n_heads, self.layer_head_dim(layer))
