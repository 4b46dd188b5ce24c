"""The factored form ``U = P W A R`` of a batch of sub-layer Jacobians, and the MLP's factor.

Every engine (:mod:`.sublayer`) describes the update ``U_n = J_n - I`` of token ``n`` as a
:class:`Factor`: a constant matrix ``W`` between a token factor ``A_n`` and the structured
pre- and post-norm Jacobians (:class:`~depthlens.models.weights.NormJacobian`). From it,
:meth:`Factor.dense` materialises the ``(N, d, d)`` operators and :meth:`Factor.total` sums
them with ``W`` applied once per batch. :func:`mlp_factor` gives the MLP sub-layer in this
form; the attention factors are in :mod:`.attention_factors`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from ..models.weights import LayerWeights, NormJacobian

__all__ = ["Factor", "mlp_factor", "mlp_update", "ple_factor", "ple_update"]


@dataclasses.dataclass
class Factor:
    """``U_n = P_n @ W @ A_n @ R_n`` for a batch of N tokens; a missing factor is the identity.

    The operator is ``J_n = scale (I + U_n)``: ``scale`` is 1 except on the last sub-layer of
    a layer whose output is multiplied by a scalar (Gemma 4's ``layer_scalar``).

    ``W`` (d, K) is constant (``Wo``, ``Wd`` or ``Wo E Wv``). The token factor ``A_n`` (K, m) is
    either dense (``A`` (N, K, m)) or a sum of row-scaled constant matrices
    ``A_n = sum_i diag(alphas[n, i]) Bs[i]`` (the MLP: ``Bs = (Wg, Wu)``), or the identity.
    ``R`` is the pre-norm Jacobian (size m), ``P`` the post-norm Jacobian (size d), both
    structured (:class:`NormJacobian`). ``normed`` optionally holds, per ``Bs[i]``, the
    products ``(g * V_n) @ Bs[i]^T`` (N, c, K) of ``R``'s gain-scaled vectors, where the caller
    has them already (:func:`mlp_factor`: the MLP's own pre-activations,
    :meth:`~depthlens.models.weights.Norm.jacobian_products`); :meth:`total` forms
    them otherwise.
    """

    W: Tensor
    n: int
    A: Tensor | None = None
    alphas: Tensor | None = None
    Bs: tuple[Tensor, ...] = ()
    R: NormJacobian | None = None
    P: NormJacobian | None = None
    scale: float = 1.0
    normed: tuple[Tensor, ...] | None = None

    def _A_dense(self) -> Tensor | None:
        if self.alphas is None:
            return self.A
        A = self.alphas[:, 0, :, None] * self.Bs[0]
        for i in range(1, len(self.Bs)):
            A.addcmul_(self.alphas[:, i, :, None], self.Bs[i])
        return A

    def dense(self) -> Tensor:
        """``J = scale (I + U)``: (N, d, d)."""
        A = self._A_dense()
        X = self.W @ A if A is not None else self.W.expand(self.n, *self.W.shape)
        if self.R is not None:
            X = self.R.right(X)
        if self.P is not None:
            X = self.P.left(X)
        elif A is None and self.R is None:
            X = X.clone()
        X.diagonal(dim1=-2, dim2=-1).add_(1.0)
        return X if self.scale == 1.0 else X.mul_(self.scale)

    def _weighted(self, c: Tensor) -> Tensor:
        """``sum_n c_n A_n R_n`` (K, m), without forming ``A_n R_n`` token by token.

        With ``R_n = diag(g) (I - V_n^T V_n / m) / s_n``:
        ``sum_n (c_n/s_n) A_n diag(g) - sum_n (c_n/(s_n m)) (A_n (g * V_n)^T) V_n``.
        """
        R = self.R
        w = c if R is None else c / R.scale
        K = self.W.shape[1]
        dt = self.W.dtype
        if self.alphas is not None:  # in place: no (K, m) temporaries beyond S
            aw = torch.einsum("n,nik->ik", w, self.alphas)
            S = self.Bs[0] * aw[0, :, None]
            for i in range(1, len(self.Bs)):
                S.addcmul_(self.Bs[i], aw[i, :, None])
        elif self.A is not None:
            S = torch.einsum("n,nkm->km", w, self.A)
        else:
            S = torch.diag(w.sum().expand(K)).to(dt)
        if R is None:
            return S
        S.mul_(R.gain)
        gV = R.vecs * R.gain  # (N, c, m)
        if self.alphas is not None:  # A_n (g V_n)^T = sum_i alpha_in * (B_i (g V_n)^T)
            normed = self.normed if self.normed is not None else tuple(gV @ B.T for B in self.Bs)
            AV = sum(self.alphas[:, i, None, :] * product for i, product in enumerate(normed))  # (N, c, K)
        elif self.A is not None:
            AV = gV @ self.A.transpose(-1, -2)
        else:
            AV = gV
        # S -= sum_n (w_n / m) AV_n^T V_n, as one rank-(N c) update in place
        left = (AV * (w / R.m)[:, None, None]).reshape(-1, AV.shape[-1])
        return S.addmm_(left.T, R.vecs.reshape(-1, R.vecs.shape[-1]).to(S.dtype), alpha=-1.0)

    def _applied(self, c: Tensor) -> Tensor:
        """``W sum_n c_n A_n R_n`` (d, m): :meth:`_weighted` with ``W`` applied.

        Without a token factor (the one-token attention, ``W = Wo E Wv``) no ``d x d x d``
        product is formed: ``W R_n`` is ``W`` with scaled columns minus rank-one terms, so
        ``sum_n (c_n/s_n) W diag(g) - sum_n (c_n/(s_n m)) (W (g * V_n)^T) V_n`` costs O(N d^2).
        """
        R = self.R
        if self.alphas is not None or self.A is not None or R is None:
            return self.W @ self._weighted(c)
        w = c / R.scale
        WgV = (R.vecs * R.gain) @ self.W.T  # (N, c, d)
        left = (WgV * (w / R.m)[:, None, None]).reshape(-1, WgV.shape[-1])
        out = self.W * (w.sum() * R.gain)
        return out.addmm_(left.T, R.vecs.reshape(-1, R.vecs.shape[-1]).to(out.dtype), alpha=-1.0)

    def _rows(self, Z: Tensor) -> Tensor:
        """``Z_n A_n R_n`` for left vectors ``Z (N, c, K)``: (N, c, m)."""
        if self.alphas is not None:
            rows = sum((Z * self.alphas[:, i, None, :]) @ B for i, B in enumerate(self.Bs))
        elif self.A is not None:
            rows = Z @ self.A
        else:
            rows = Z
        return self.R.right(rows) if self.R is not None else rows

    def total(self) -> Tensor:
        """``sum_n U_n`` (d, d) with ``W`` applied once to summed token factors (``scale`` not applied).

        No post-norm: ``W sum_n A_n R_n``. With ``P_n = diag(g) (I - sum_c u u^T / d) / s_n``:
        ``diag(g) [W sum_n A_n R_n / s_n - sum_n sum_c u_nc (u_nc^T W A_n R_n) / (d s_n)]``.
        Cost O(N K m) in matrix products plus one ``d x K x m`` product, instead of N of them.
        """
        ones = torch.ones(self.n, dtype=self.W.dtype, device=self.W.device)
        if self.P is None:
            return self._applied(ones)
        P = self.P
        first = self._applied(1.0 / P.scale)
        rows = self._rows(P.vecs @ self.W)  # (N, c, m)
        second = torch.einsum("n,ncd,nce->de", 1.0 / (P.scale * P.m), P.vecs, rows)
        return P.gain[:, None] * (first - second)


def _act_and_slope(act: Callable[[Tensor], Tensor], u: Tensor) -> tuple[Tensor, Tensor]:
    """``act(u)`` and its elementwise derivative, by forward-mode differentiation of the model's activation."""
    return torch.func.jvp(act, (u,), (torch.ones_like(u),))


def _mlp_forward(ops: LayerWeights, x: Tensor, output: bool = True
                 ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None, tuple[Tensor, ...]]:
    """The MLP at residuals ``x (N, d)``: ``(act'(u), act(u), w or None, out, products)`` with
    ``u`` the gate's and ``w`` the up projection's pre-activations, ``out`` the output before
    any post-norm (None unless ``output``) and ``products`` the normed residual ``n`` times
    ``Wg^T`` (and ``Wu^T``), before the biases."""
    n = ops.mlp_in(x) if ops.mlp_in is not None else x
    products = tuple(n @ B.T for B in (ops.Wg, ops.Wu) if B is not None)
    u = products[0] if ops.bg is None else products[0] + ops.bg
    f, df = _act_and_slope(ops.act, u)
    w = None
    if ops.Wu is not None:
        w = products[1] if ops.bu is None else products[1] + ops.bu
    if not output:
        return df, f, w, None, products
    out = (f if w is None else f * w) @ ops.Wd.T
    return df, f, w, out if ops.bd is None else out + ops.bd, products


def mlp_update(ops: LayerWeights, x: Tensor) -> Tensor:
    """What the MLP sub-layer adds to residuals ``x (N, d)``: ``mlp_post(Wd z + bd)``."""
    out = _mlp_forward(ops, x)[3]
    assert out is not None
    return ops.mlp_post(out) if ops.mlp_post is not None else out


def mlp_factor(ops: LayerWeights, x: Tensor, scale: float = 1.0) -> Factor:
    """The MLP sub-layer at residuals ``x (N, d)``: ``A_n = diag(act'(u) * w) Wg + diag(act(u)) Wu`` as row scalings."""
    R = ops.mlp_in.jacobian(x) if ops.mlp_in is not None else None
    df, f, w, out, products = _mlp_forward(ops, x, output=ops.mlp_post is not None)
    if w is not None:
        alphas, Bs = torch.stack([df * w, f], dim=1), (ops.Wg, ops.Wu)
    else:
        alphas, Bs = df[:, None, :], (ops.Wg,)
    P = ops.mlp_post.jacobian(out) if ops.mlp_post is not None and out is not None else None
    return Factor(ops.Wd, x.shape[0], alphas=alphas, Bs=Bs, R=R, P=P, scale=scale,
                  normed=None if ops.mlp_in is None else ops.mlp_in.jacobian_products(products, Bs))


def _ple_forward(ops: LayerWeights, r: Tensor, p: Tensor) -> tuple[Tensor, Tensor]:
    """``(act'(u) * p, out)`` of the per-layer-input update at residuals ``r (N, d)`` and per-layer
    inputs ``p (N, dp)``: ``u = Wg r``, ``out = Wp (act(u) * p)`` before the post-norm."""
    ple = ops.ple
    assert ple is not None
    f, df = _act_and_slope(ple.act, r @ ple.Wg.T)
    return df * p, (f * p) @ ple.Wp.T


def ple_update(ops: LayerWeights, r: Tensor, p: Tensor) -> Tensor:
    """What the per-layer-input sub-layer adds to residuals ``r (N, d)`` given the per-layer inputs ``p (N, dp)``."""
    return ops.ple.post(_ple_forward(ops, r, p)[1])  # type: ignore[union-attr]


def ple_factor(ops: LayerWeights, r: Tensor, p: Tensor, scale: float = 1.0) -> Factor:
    """The per-layer-input sub-layer at residuals ``r (N, d)`` and per-layer inputs ``p (N, dp)``:
    ``U_n = P_n Wp diag(act'(Wg r_n) * p_n) Wg`` (``p`` is not a function of the residual)."""
    slope, out = _ple_forward(ops, r, p)
    return Factor(ops.ple.Wp, r.shape[0], alphas=slope[:, None, :], Bs=(ops.ple.Wg,),  # type: ignore[union-attr]
                  P=ops.ple.post.jacobian(out), scale=scale)  # type: ignore[union-attr]
