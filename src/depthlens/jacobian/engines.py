"""Exact sub-layer Jacobians of the residual stream (§B1), in closed form.

Operators
    For every layer ``l`` two maps, skip connection included, ``J = I + U``:
    ``attn`` (pre-attention residual -> pre-MLP residual) and ``mlp`` (pre-MLP residual ->
    next pre-attention residual). Each is evaluated at an observed residual (from
    :meth:`Adapter.residual_states`), or for the ``isolated`` MLP at a state computed from one,
    and returned as a dense ``(d, d)`` matrix per token.

Gemma 4 (three sub-layers a layer)
    A third map, ``ple`` (residual before the per-layer-input update -> next pre-attention
    residual): ``J = s (I + P(y) Wp diag(act'(Wg r) * p) Wg)`` with ``p`` the layer's per-layer
    input at the token (a function of the token, not of the residual), ``P`` the post-norm
    Jacobian at ``y = Wp (act(Wg r) * p)`` and ``s`` the layer's ``layer_scalar``, carried by
    the last sub-layer so that the three operators chain boundary to boundary. Values pass a
    scale-free per-head norm, so the value path is ``J_v(v) Wv`` per token instead of ``Wv``
    (and ``Wv = Wk`` where values come from the keys). A layer that reads an earlier layer's
    keys and values varies through its query alone: ``in_context`` drops the own-key and
    own-value terms (the keys and values come from the source layer's states), and the
    ``isolated`` one-token attention has ``U = 0``; its one-token output, which the block's
    later sub-layers read, uses the value the source layer computes from the token's own
    state there. The engines take those states and the per-layer inputs beside the residual
    (:func:`~depthlens.jacobian.sublayer.state_reads`, :func:`~depthlens.jacobian.sublayer.engine_states`).

Modes
    ``isolated`` (default, the source paper's protocol): the token's observed pre-attention
    residual ``x`` fed through the whole decoder block as a one-token sequence. One key means
    softmax weight 1, so attention is its value-output path and
    ``U_attn = P(a) Wo E Wv N(x)`` where ``N`` is the pre-norm Jacobian, ``E`` repeats each
    key/value head for the query heads of its group, and ``P`` the post-norm Jacobian (Gemma 3,
    OLMo 2/3) at the attention output ``a``. RoPE and q/k norms act on queries and keys only,
    so they drop out. ``Wo E Wv`` is formed once per layer, so a token costs O(d^2). The MLP
    operator is taken inside that standalone block, at ``x1 = x + post(Wo E (Wv N(x) + bv) +
    bo)`` (the one-token attention output, computed in the weights' dtype), not at the
    observed pre-MLP residual; so ``J_mlp(x1) J_attn(x)`` is exactly the Jacobian of the
    decoder layer run on the one-token sequence ``x``.
    ``isolated_observed``: each sub-layer one-token at its own observed residual: the same
    attention operator, the MLP at the observed in-context pre-MLP residual (a sensitivity
    variant).
    ``in_context``: the diagonal block ``d h_{l+1}[t] / d h_l[t]`` with every other position
    of the chunk held fixed. Keys and values of the other positions are computed once per
    chunk; only the token's query, own key and own value vary. Per query head ``h`` (key/value
    group ``g``) with weights ``p_j``, softmax-slope ``kappa_j`` (1 without soft-capping),
    ``w_j = kappa_j p_j``, output ``o = sum_j p_j v_j`` and ``kbar = sum_j w_j k_j``:

    - through the query: ``do/dq = c (sum_j w_j v_j k_j^T - o kbar^T)``, ``c`` the score scale;
    - through the own key: ``do/dk_t = c w_t (v_t - o) q^T``;
    - through the own value: ``do/dv_t = p_t I``;

    RoPE is the fixed rotation ``R_t`` (``q = R_t q~``, ``k_t = R_t k~_t``), q/k norms enter
    through their Jacobians, so ``do/dn = (do/dq) R_t Jq Wq + (do/dk_t) R_t Jk Wk + p_t Wv``
    (``n`` the normed residual) and ``U = P(a) Wo (do/dn) N(h_t)``.
    The MLP is position-wise, so ``isolated_observed`` and ``in_context`` give the same MLP operator.
    MLP: ``U_mlp = P(out) Wd [diag(act'(u) * w) Wg + diag(act(u)) Wu] N(x)`` (gated:
    Llama, Gemma 3, OLMo) or ``P(out) Wd diag(act'(u)) Wi N(x)`` (GPT-2, GPT-NeoX); ``act'``
    comes from forward-mode differentiation of the model's own activation module (exact for an
    elementwise function). Norm Jacobians: see :class:`~depthlens.models.weights.NormJacobian`.

Parallel residual (GPT-NeoX / Pythia with ``use_parallel_residual``)
    The layer is ``h' = h + A(h) + F(h)``: both branches read the pre-attention state ``h``.
    depthlens defines ``attn = I + dA/dh`` and ``mlp = I + dF/dh``, both evaluated at ``h``
    (state ``2l``, in every mode: the one-token block's MLP reads ``h`` too, so ``isolated``
    and ``isolated_observed`` coincide; :func:`input_state` says which state to pass). The
    block Jacobian is ``I + dA/dh + dF/dh = attn + mlp - I``, which differs from the product ``mlp @ attn`` by
    ``dF/dh dA/dh``: cumulative products over such operators are a convention, not the model's
    exact chain rule.

Precision
    Every engine reads the layer's weights once (:meth:`Adapter.layer_weights`), cast to
    ``dtype`` (float64 by default), and caches them per adapter
    (:func:`~depthlens.jacobian._layers.layer_ops`); all arithmetic,
    norms included, runs in that dtype. The operator is that of the float64 copy of the weights
    (for a float32 model: exactly the model's weights, evaluated without float32 rounding).
    RoPE angles are the model's own (its rotary module computes cos/sin in float32), used as
    they are. Residual inputs are cast to ``dtype``.

Cost (d model width, F MLP width, H query heads of width hd, T context)
    Per token and layer, materialised (``sublayer_jacobians``): isolated attention O(d^2) (and
    O(d H hd) for the one-token attention output the ``isolated`` MLP reads);
    in-context attention O(H T hd^2 + H hd^2 d) plus one ``d x (H hd) x d`` product; MLP one
    ``d x F x d`` product (the same FLOPs as one reverse-mode Jacobian, so the dense MLP path is
    no faster than autograd in the same dtype). Summed (``sublayer_jacobian_sum``,
    ``mean_operators``): the constant left factor (``Wo``, ``Wd``) is applied once per batch to
    the summed token factors, so a token costs O(F d) (MLP) or O(H hd d + H T hd^2) (attention)
    and a batch adds one ``d x K x d`` product.

Modules
    :mod:`.factor` (the factored form ``U = P W A R`` and the MLP factor),
    :mod:`.attention_factors` (isolated and in-context attention), :mod:`.sublayer`
    (validation and the per-token entry points), :mod:`.mean` (mean operators over chunks,
    and their sums chunk by chunk).
    This module gathers their public names.

Examples
--------
>>> import torch
>>> from depthlens.models import load_model
>>> from depthlens.jacobian.engines import sublayer_jacobians, input_state
>>> ad = load_model("random:llama").adapter
>>> hs = ad.residual_states(torch.randint(0, 256, (2, 8)))
>>> J = sublayer_jacobians(ad, hs[input_state(ad, 0, "attn")], 0, "attn", jacobian_mode="in_context")
>>> J.shape, J.dtype
(torch.Size([2, 64, 64]), torch.float64)
"""

from __future__ import annotations

from ._layers import clear_cache
from .mean import MeanAccumulator, chunk_operator_sums, mean_operators
from .sublayer import (KINDS, POSITIONS, engine_states, input_state, kv_state, read_states, state_reads,
                       sublayer_jacobian_sum, sublayer_jacobians)

__all__ = [
    "KINDS",
    "POSITIONS",
    "MeanAccumulator",
    "chunk_operator_sums",
    "clear_cache",
    "engine_states",
    "input_state",
    "kv_state",
    "mean_operators",
    "read_states",
    "state_reads",
    "sublayer_jacobian_sum",
    "sublayer_jacobians",
]
