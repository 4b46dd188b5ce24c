"""Options of ``depthlens train``: the model, the data, the optimiser and the checkpoints."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from ..config import is_prompts_file
from ..errors import InputError
from ..options import check_fields

__all__ = ["MAX_SEED", "TrainOptions"]

#: Largest seed: ``torch.manual_seed`` takes 64 bits.
MAX_SEED = 2**64 - 1


@dataclass(frozen=True)
class TrainOptions:
    """Everything that determines the weights of a trained series (recorded in its manifest;
    the same options give bit-identical checkpoints in the same process setting).

    Parameters
    ----------
    family : str
        architecture family of the registry (llama: RMSNorm and RoPE; gpt_neox, gpt2:
        LayerNorm; `depthlens models` lists them all), with its configuration written in code
    n_layers : int
        decoder layers
    d_model : int
        residual width
    n_heads : int
        attention heads per layer (every head has its own keys and values); must divide --d-model
    d_ff : int
        MLP hidden width
    seq_len : int
        tokens per training sequence including the start token; also the model's context
    batch_size : int
        sequences per step
    steps : int
        optimiser steps
    lr : float
        peak learning rate of AdamW (betas 0.9, 0.95), reached
        linearly over --warmup steps, then cosine decay to a tenth of it at the last step
    warmup : int
        steps of linear learning-rate warm-up from 0
    weight_decay : float
        decoupled weight decay of AdamW on the weight matrices and embeddings (not on norm
        weights or biases)
    grad_clip : float
        the gradient's global norm is clipped to this value each step (0: no clipping)
    init_std : float
        standard deviation of the initial weights (the configuration's initializer_range)
    checkpoints : int
        about this many checkpoints at log-spaced steps up to --steps (the last step always),
        plus step 0
    text : str
        training text: python-docs (offline), wikitext-2 or a UTF-8 text file
    tokenizer : str or None
        the tokenizer of this model (smollm2-135m, a hub id or a folder), whose vocabulary
        size the model gets; unset: the byte-level tokenizer (256 ids)
    heldout : float
        fraction of the token stream, at its end, held out: never trained on, its loss is
        measured at every checkpoint
    eval_seqs : int
        held-out sequences (consecutive windows from the start of the held-out split) whose
        mean loss is measured at every checkpoint
    repeat_fraction : float
        fraction of each batch's sequences that are a block of uniform random ordinary tokens
        repeated to the end of the sequence ([start, r, r, r, ...], the block length uniform
        in --repeat-min..--repeat-max, a fresh block per sequence): a sequence whose second and
        later copies only an induction head predicts, and which trains the embedding of every
        token id (text alone leaves unseen ids, e.g. most bytes above 127, at their initial
        values); 0: text alone
    repeat_min : int
        shortest repeated block
    repeat_max : int
        longest repeated block; at most (--seq-len - 1) / 2, so every block repeats at least once
    seed : int
        seed of the initial weights and of every batch (the batch of step s is a function of
        the seed and s alone)
    """

    family: str = "llama"
    n_layers: int = field(default=2, metadata={"min": 1})
    d_model: int = field(default=128, metadata={"min": 1})
    n_heads: int = field(default=4, metadata={"min": 1})
    d_ff: int = field(default=512, metadata={"min": 1})
    seq_len: int = field(default=128, metadata={"min": 2})
    batch_size: int = field(default=32, metadata={"min": 1})
    steps: int = field(default=1000, metadata={"min": 1})
    lr: float = field(default=1e-3, metadata={"min": 0.0})
    warmup: int = field(default=100, metadata={"min": 0})
    weight_decay: float = field(default=0.1, metadata={"min": 0.0})
    grad_clip: float = field(default=1.0, metadata={"min": 0.0})
    init_std: float = field(default=0.02, metadata={"min": 0.0})
    checkpoints: int = field(default=10, metadata={"min": 1})
    text: str = "python-docs"
    tokenizer: str | None = None
    heldout: float = field(default=0.05, metadata={"min": 0.0})
    eval_seqs: int = field(default=32, metadata={"min": 1})
    repeat_fraction: float = field(default=0.0, metadata={"min": 0.0})
    repeat_min: int = field(default=8, metadata={"min": 1})
    repeat_max: int = field(default=64, metadata={"min": 1})
    seed: int = field(default=0, metadata={"min": 0})

    def __post_init__(self) -> None:
        check_fields(self)
        if self.seed > MAX_SEED:
            raise InputError(f"--seed {self.seed} is too large; pass an integer from 0 to {MAX_SEED} (2**64 - 1).")
        if self.d_model % self.n_heads:
            raise InputError(f"--n-heads {self.n_heads} does not divide --d-model {self.d_model}; pass e.g. "
                             f"--n-heads {_divisor(self.d_model, self.n_heads)}.")
        if not 0.0 < self.heldout < 1.0:
            raise InputError(f"--heldout {self.heldout} is not a fraction strictly between 0 and 1; pass e.g. 0.05.")
        if self.repeat_fraction > 1.0:
            raise InputError(f"--repeat-fraction {self.repeat_fraction} is above 1; pass a fraction from 0 to 1.")
        if self.repeat_min > self.repeat_max:
            raise InputError(f"--repeat-min {self.repeat_min} is above --repeat-max {self.repeat_max}; "
                             "pass --repeat-min no larger than --repeat-max.")
        if self.repeat_fraction > 0 and 2 * self.repeat_max > self.seq_len - 1:
            raise InputError(f"--repeat-max {self.repeat_max} leaves no room for two copies in --seq-len "
                             f"{self.seq_len}; pass --repeat-max {(self.seq_len - 1) // 2} or less.")
        if not self.family.strip():
            raise InputError("--family is empty; pass an architecture family, e.g. --family llama.")
        if self.tokenizer is not None and not self.tokenizer.strip():
            raise InputError("--tokenizer is empty; pass a model spec (e.g. smollm2-135m) or leave it out for bytes.")
        if not self.text:
            raise InputError("--text is empty; pass --text python-docs, wikitext-2 or a file path.")
        if is_prompts_file(self.text):
            raise InputError(f"--text {self.text} is a prompts file (.jsonl), which the analysis commands take; "
                             "depthlens train needs a text corpus: pass python-docs, wikitext-2 or a text file.")

    def to_dict(self) -> dict[str, Any]:
        """The options as a plain JSON-serialisable dict."""
        return dataclasses.asdict(self)

    def hash(self) -> str:
        """A short stable hash of the options (16 hex digits of SHA-256): a series resumes only
        under the same hash."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def _divisor(width: int, heads: int) -> int:
    """The largest divisor of ``width`` not above ``heads``."""
    return max(h for h in range(1, min(width, heads) + 1) if width % h == 0)
