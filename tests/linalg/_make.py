"""Random test operators for the linalg tests."""

from depthlens.linalg.causal import random_causal_attention as causal_softmax

__all__ = ["causal_softmax"]
