"""Per-matrix attention features: the certified reserve records an exhausted budget in its
flag without repeating the linalg warning for every head."""

from __future__ import annotations

import warnings

import numpy as np

from depthlens.attention.features import certified_reserve
from depthlens.linalg.causal import random_causal_attention


def test_certified_reserve_flags_budget_without_warning() -> None:
    A = random_causal_attention(32, np.random.default_rng(0), sink=1.0, prev=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning (CertificationBudgetWarning included) fails
        row = certified_reserve(A, 1e-3, 1)
    assert row["kreiss_B_certified"] == 0.0 and row["kreiss_B_lo"] <= row["kreiss_B_hi"]
