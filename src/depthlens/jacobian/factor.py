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

__all__ = ["Factor", "mlp_factor"]


@dataclasses.dataclass
class Factor:
    """``U_n = P_n @ W @ A_n @ R_n`` for a batch of N tokens; a missing factor is the identity.

    ``W`` (d, K) is constant (``Wo``, ``Wd`` or ``Wo E Wv``). The token factor ``A_n`` (K, m) is
    either dense (``A`` (N, K, m)) or a sum of row-scaled constant matrices
    ``A_n = sum_i diag(alphas[n, i]) Bs[i]`` (the MLP: ``Bs = (Wg, Wu)``), or the identity.
    ``R`` is the pre-norm Jacobian (size m), ``P`` the post-norm Jacobian (size d), both
    structured (:class:`NormJacobian`).
    """

    W: Tensor
    n: int
    A: Tensor | None = None
    alphas: Tensor | None = None
    Bs: tuple[Tensor, ...] = ()
    R: NormJacobian | None = None
    P: NormJacobian | None = None

    def _A_dense(self) -> Tensor | None:
        if self.alphas is None:
            return self.A
        A = self.alphas[:, 0, :, None] * self.Bs[0]
        for i in range(1, len(self.Bs)):
            A.addcmul_(self.alphas[:, i, :, None], self.Bs[i])
        return A

    def dense(self) -> Tensor:
        """``J = I + U``: (N, d, d)."""
        A = self._A_dense()
        X = self.W @ A if A is not None else self.W.expand(self.n, *self.W.shape)
        if self.R is not None:
            X = self.R.right(X)
        if self.P is not None:
            X = self.P.left(X)
        elif A is None and self.R is None:
            X = X.clone()
        X.diagonal(dim1=-2, dim2=-1).add_(1.0)
        return X

    def _weighted(self, c: Tensor) -> Tensor:
        """``sum_n c_n A_n R_n`` (K, m), without forming ``A_n R_n`` token by token.

        With ``R_n = diag(g) (I - V_n^T V_n / m) / s_n``:
        ``sum_n (c_n/s_n) A_n diag(g) - sum_n (c_n/(s_n m)) (A_n (g * V_n)^T) V_n``.
        """
        R = self.R
        w = c if R is None else c / R.scale
        K = self.W.shape[1]
        dt = self.W.dtype
        if self.alphas is not None:
            aw = torch.einsum("n,nik->ik", w, self.alphas)
            S = sum(aw[i, :, None] * B for i, B in enumerate(self.Bs))
        elif self.A is not None:
            S = torch.einsum("n,nkm->km", w, self.A)
        else:
            S = torch.diag(w.sum().expand(K)).to(dt)
        if R is None:
            return S
        S = S * R.gain
        gV = R.vecs * R.gain  # (N, c, m)
        if self.alphas is not None:  # A_n (g V_n)^T = sum_i alpha_in * (B_i (g V_n)^T)
            AV = sum(self.alphas[:, i, None, :] * (gV @ B.T) for i, B in enumerate(self.Bs))  # (N, c, K)
        elif self.A is not None:
            AV = gV @ self.A.transpose(-1, -2)
        else:
            AV = gV
        return S - torch.einsum("n,nck,ncm->km", w / R.m, AV, R.vecs)

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
        return self.W * (w.sum() * R.gain) - torch.einsum("n,ncd,ncm->dm", w / R.m, WgV, R.vecs)

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
        """``sum_n U_n`` (d, d) with ``W`` applied once to summed token factors.

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


def mlp_factor(ops: LayerWeights, x: Tensor) -> Factor:
    """The MLP sub-layer at residuals ``x (N, d)``: ``A_n = diag(act'(u) * w) Wg + diag(act(u)) Wu`` as row scalings."""
    R = ops.mlp_in.jacobian(x) if ops.mlp_in is not None else None
    n = ops.mlp_in(x) if ops.mlp_in is not None else x
    u = n @ ops.Wg.T
    if ops.bg is not None:
        u = u + ops.bg
    f, df = _act_and_slope(ops.act, u)
    if ops.Wu is not None:
        w = n @ ops.Wu.T
        if ops.bu is not None:
            w = w + ops.bu
        alphas, Bs = torch.stack([df * w, f], dim=1), (ops.Wg, ops.Wu)
        z = f * w
    else:
        alphas, Bs = df[:, None, :], (ops.Wg,)
        z = f
    P = None
    if ops.mlp_post is not None:
        out = z @ ops.Wd.T
        if ops.bd is not None:
            out = out + ops.bd
        P = ops.mlp_post.jacobian(out)
    return Factor(ops.Wd, x.shape[0], alphas=alphas, Bs=Bs, R=R, P=P)
