"""Interventions: head ablation and residual clamps, as context managers that remove themselves.

:class:`Interventions` is mixed into :class:`~depthlens.models.adapter.Adapter` and gives it
:meth:`~Interventions.ablate_head` (replace query heads' outputs at the input of the
attention output projection), :meth:`~Interventions.ablate_each` (a head per block of rows) and :meth:`~Interventions.clamp` (overwrite residual entries at
the input of decoder layers ``>= from_layer`` and of the final norm). Both act on every
forward pass of the model while active, and their hooks are removed on exit, also after an
exception. :meth:`~Interventions.start_at` lets a forward pass take a known input of a layer
instead of computing the layers below it (for many passes that differ only from that layer on).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch
from torch import Tensor, nn

from ..errors import InputError, ModelError
from .methods import ABLATION_METHODS, AblationMethod
from .hooks import _Stop, first_arg, replace_first_arg

__all__ = ["ABLATION_METHODS", "AblationMethod", "Interventions"]



class Interventions:
    """Head ablation and residual clamps of an :class:`~depthlens.models.adapter.Adapter` (a mixin of it).

    Hooks the adapter's output projections (``_oprojs``), decoder layers (``layers``) and
    final norm (``_final_norm_module``); :meth:`start_at` replaces the ``forward`` of decoder
    layers for its block.
    """

    #: How many interventions are active on this adapter: forward passes under one are not
    #: shared (:meth:`~depthlens.models.hooks.Captures.shared_passes`).
    _active: int = 0

    @contextlib.contextmanager
    def _acting(self, handles: list) -> Iterator[None]:
        """Count an intervention as active for the block, then remove its hook ``handles``
        (those registered so far, also after an exception)."""
        self._active += 1
        try:
            yield
        finally:
            self._active -= 1
            for handle in handles:
                handle.remove()

    @contextlib.contextmanager
    def ablate_head(
        self,
        layer: int,
        head: int | Sequence[int],
        method: AblationMethod = "zero",
        value: Tensor | None = None,
    ) -> Iterator[None]:
        """Replace query heads' outputs at the input of ``layer``'s output projection.

        Parameters
        ----------
        layer : int
        head : int or sequence of int
            One head, or several ablated together.
        method : {"zero", "mean", "resample"}
            ``zero``: set to 0. ``mean``: set to ``value``, the head's mean output vector,
            shape ``(hd,)`` for one head or ``(n, hd)`` for ``n`` heads (e.g. the mean of
            :meth:`head_outputs` over batch and positions). ``resample``: set to ``value`` of
            shape ``(B, T, hd)`` for one head or ``(B, T, n, hd)`` for ``n`` heads (outputs on
            other inputs; ``B`` may be 1 to broadcast).
        value : Tensor, optional
            For ``mean`` and ``resample`` (see ``method``); None for ``zero``.

        The hook acts on every call of the projection: the model's forward pass and the
        :meth:`sublayer` / :meth:`block` maps. It is removed on exit, also after an exception.

        Raises
        ------
        InputError
            For a bad layer, head, method or value shape (value shapes against the sequence
            length are checked when the hook fires).
        """
        self.check_layer(layer)
        heads = self._check_heads(head)
        single = isinstance(head, int)
        if method not in ABLATION_METHODS:
            raise InputError(f"ablation method {method!r} is not one of {ABLATION_METHODS}.")
        hd = self.layer_head_dim(layer)
        n = len(heads)
        if method == "zero":
            if value is not None:
                raise InputError("zero ablation takes no value; leave value=None.")
        else:
            if value is None:
                raise InputError(f"{method} ablation needs a value (see head_outputs).")
            value = torch.as_tensor(value)
            if single:
                value = value.unsqueeze(-2)
            want = (n, hd)
            if method == "mean" and tuple(value.shape) != want:
                shape = "(hd,)" if single else "(n, hd)"
                raise InputError(f"mean ablation value has shape {tuple(value.shape)}; expected {shape} with hd={hd}.")
            if method == "resample" and (value.ndim != 4 or tuple(value.shape[-2:]) != want):
                shape = "(B, T, hd)" if single else "(B, T, n, hd)"
                raise InputError(f"resample value has shape {tuple(value.shape)}; expected {shape} with hd={hd}.")
        index = torch.tensor(heads)

        def hook(module: nn.Module, args: tuple) -> tuple:
            x = args[0]
            B, T = x.shape[0], x.shape[1]
            y = x.reshape(B, T, self.n_heads, hd).clone()
            idx = index.to(x.device)
            if method == "zero":
                y[:, :, idx, :] = 0
            elif method == "mean":
                y[:, :, idx, :] = value.to(device=x.device, dtype=x.dtype)
            else:
                v = value.to(device=x.device, dtype=x.dtype)
                if v.shape[1] != T or v.shape[0] not in (1, B):
                    raise InputError(
                        f"resample value has shape {tuple(v.shape)}; the input has B={B}, T={T} (B may be 1)."
                    )
                y[:, :, idx, :] = v.expand(B, T, n, hd)
            return (y.reshape(x.shape), *args[1:])

        with self._acting([self._oprojs[layer].register_forward_pre_hook(hook)]):
            yield

    @contextlib.contextmanager
    def ablate_each(
        self,
        layer: int,
        heads: Sequence[int],
        method: AblationMethod = "zero",
        values: Tensor | None = None,
    ) -> Iterator[None]:
        """One ablation per block of rows: a batch of ``len(heads) · B`` rows is read as
        ``len(heads)`` blocks of ``B`` rows, and block ``i`` has head ``heads[i]`` of ``layer``
        replaced as :meth:`ablate_head` would (so every head of a layer is ablated in one
        forward pass over copies of the same inputs).

        Parameters
        ----------
        layer : int
        heads : sequence of int
            The head of each block (repeats allowed, e.g. a block per method).
        method : {"zero", "mean", "resample"}
        values : Tensor, optional
            None for ``zero``; ``(n, hd)`` for ``mean``; ``(n, B, T, hd)`` for ``resample``
            (``n = len(heads)``).

        Raises
        ------
        InputError
            For a bad layer, head, method or value shape, or a batch that is not ``n`` blocks.
        """
        self.check_layer(layer)
        if not len(heads):
            raise InputError("no heads given; pass one head per block of rows.")
        index = [self._check_heads(h)[0] for h in heads]
        if method not in ABLATION_METHODS:
            raise InputError(f"ablation method {method!r} is not one of {ABLATION_METHODS}.")
        n, hd = len(index), self.layer_head_dim(layer)
        if method == "zero":
            if values is not None:
                raise InputError("zero ablation takes no value; leave values=None.")
        else:
            want = 2 if method == "mean" else 4
            values = None if values is None else torch.as_tensor(values)
            if values is None or values.ndim != want or values.shape[0] != n or values.shape[-1] != hd:
                shape = "(n, hd)" if method == "mean" else "(n, B, T, hd)"
                got = None if values is None else tuple(values.shape)
                raise InputError(f"{method} ablation values have shape {got}; expected {shape} with n={n}, hd={hd}.")
            if method == "mean":
                values = values[:, None, None, :]
        blocks, heads_t = torch.arange(n), torch.tensor(index)

        def hook(module: nn.Module, args: tuple) -> tuple:
            x = args[0]
            if x.shape[0] % n:
                raise InputError(f"a batch of {x.shape[0]} rows is not {n} blocks of equal size.")
            y = x.reshape(n, x.shape[0] // n, x.shape[1], self.n_heads, hd).clone()
            b, h = blocks.to(x.device), heads_t.to(x.device)
            y[b, :, :, h] = 0 if values is None else values.to(device=x.device, dtype=x.dtype).expand(
                n, y.shape[1], y.shape[2], hd)
            return (y.reshape(x.shape), *args[1:])

        with self._acting([self._oprojs[layer].register_forward_pre_hook(hook)]):
            yield

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
        self.check_layer(from_layer, allow_end=True)
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
                return replace_first_arg(args, kwargs, apply(layer, first_arg(args, kwargs, name)), name)

            return hook

        handles: list = []
        with self._acting(handles):
            for i in range(from_layer, L):
                handles.append(self.layers[i].register_forward_pre_hook(make(i), with_kwargs=True))
            handles.append(self._final_norm_module.register_forward_pre_hook(make(L), with_kwargs=True))
            yield

    def layer_output(self, input_ids: Tensor, layer: int) -> Tensor:
        """What decoder layer ``layer`` passes on to the next (its output after its hooks,
        those of active interventions included), from one forward pass that stops there: the
        ``h`` of :meth:`start_at` for layer ``layer + 1``.

        Raises
        ------
        InputError
            For bad ids or a layer out of range.
        ModelError
            For a family whose layers return more than the residual.
        """
        ids = self._ids(input_ids)
        self.check_layer(layer)
        out: list = []

        def keep(module: nn.Module, args: tuple, output: object) -> None:
            out.append(output)
            raise _Stop

        with self._hooked(ids) as handles:
            handles.append(self.layers[layer].register_forward_hook(keep))
        if not isinstance(out[0], Tensor):
            raise ModelError(f"{self.family} layers return {type(out[0]).__name__}, not the residual alone; "
                             "passes cannot start after one of them.")
        return out[0]

    @contextlib.contextmanager
    def start_at(self, layer: int, h: Tensor) -> Iterator[None]:
        """Within the block, a forward pass takes ``h`` as what layer ``layer − 1`` passes on
        instead of computing layers ``0 … layer − 1`` (they return ``h`` unevaluated).

        ``h`` must be :meth:`layer_output` of ``layer − 1`` on the ids the passes are given (from
        an earlier pass on the same batch, with the same hooks on the layers below ``layer``).
        The passes are then the whole forward pass bit for bit (layer ``layer`` and its hooks,
        interventions acting from there on, the later layers and the logits see the same values)
        in about ``(L − layer)/L`` of its time: for many passes that differ only from ``layer``
        on, as the arms of a clamp from its first clamped layer. Interventions below ``layer`` do
        not act. A pass inside the block is not shared (:meth:`shared_passes`).

        Raises
        ------
        InputError
            For a layer out of range.
        ModelError
            For a family whose layers are not maps of the residual alone (:attr:`block_maps`
            False), or, after the block, when layer ``layer`` was given something else than
            ``h`` (a family whose layers return more than the residual, or a hook that replaces
            the output of a layer below ``layer``).
        """
        self.check_layer(layer)
        if not self.block_maps:
            raise ModelError(f"{self.family} layers read more than the residual; a pass cannot start at layer {layer}.")
        given: list[bool] = []

        def check(module: nn.Module, args: tuple, kwargs: dict) -> None:
            given.append(first_arg(args, kwargs) is h)

        def skipped(*args: object, **kwargs: object) -> Tensor:
            return h

        handles = [self.layers[layer].register_forward_pre_hook(check, with_kwargs=True, prepend=True)]
        own = [vars(self.layers[i]).get("forward") for i in range(layer)]  # e.g. a wrapper set by accelerate
        with self._acting(handles):
            for i in range(layer):
                self.layers[i].forward = skipped
            try:
                yield
            finally:
                for i, forward in enumerate(own):
                    if forward is None:
                        del self.layers[i].forward
                    else:
                        self.layers[i].forward = forward
        if not all(given):
            raise ModelError(f"{self.family} layer {layer} was not given the residual its earlier layers returned; "
                             "start passes at layer 0 for this family.")
