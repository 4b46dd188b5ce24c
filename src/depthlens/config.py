"""Typed, validated run configuration, read from TOML files and command-line flags."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InputError

if TYPE_CHECKING:
    from .attention.analysis import AttentionOptions
    from .jacobian.stage import JacobianOptions
    from .topology.stage import TopologyOptions

DTYPES = ("float32", "float64", "bfloat16", "float16")


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a run's numbers.

    Execution options that do not change the results (output folder, resume/overwrite,
    progress bars) are not part of the configuration, so a resumed run has the same hash.

    Parameters
    ----------
    model : str
        Model spec: ``smollm2-135m`` (embedded default), a hub id, a local folder, a
        ``.gguf`` file, or ``random:<family>[:<overrides>]``.
    revision : str or None
        Hub revision (checkpoint) of ``model``.
    text : str
        Text source: ``python-docs`` (default, offline), ``wikitext-2`` or a file path.
    chunks : int
        Number of text chunks (>= 1).
    seq_len : int
        Tokens per chunk including BOS (>= 2).
    seed : int
        The one seed of the run; every unit spawns its own stream from it.
    batch_size : int
        Chunks per forward pass (>= 1); also the size of one resumable unit.
    dtype : str
        Model weight dtype; analyses are float64 regardless.
    device : str
        Torch device for the model.
    trust_remote_code : bool
        Allow a hub model's own code to run.
    null_mode, null_samples, null_chunks, extras_chunks, certify, probe_seqs, probe_len
        Attention-stage options, see :class:`depthlens.attention.analysis.AttentionOptions`.
        The run defaults (8 null samples on 8 chunks, extras on the first chunk) keep the default
        attention stage on SmolLM2 under 10 minutes on 2 cores; METHODS A4's S = 16 is
        ``null_samples=16``.
    jacobian_mode, positions, funnel_rank, null, revisions
        Jacobian-stage options (``jacobian_mode`` isolated, in_context or both; ``revisions``
        comma-separated), see :class:`depthlens.jacobian.stage.JacobianOptions`.
    topk, n_perm, exclude_massive, amplification
        Topology-stage options, see :class:`depthlens.topology.stage.TopologyOptions`.
    """

    model: str = "smollm2-135m"
    revision: str | None = None
    text: str = "python-docs"
    chunks: int = 32
    seq_len: int = 128
    seed: int = 0
    batch_size: int = 4
    dtype: str = "float32"
    device: str = "cpu"
    trust_remote_code: bool = False
    null_mode: str = "spec"
    null_samples: int = 8
    null_chunks: int = 8
    extras_chunks: int = 1
    certify: str = "median"
    probe_seqs: int = 128
    probe_len: int = 64
    jacobian_mode: str = "both"
    positions: str = "last"
    funnel_rank: int = 512
    null: str = "init"
    revisions: str = ""
    topk: int = 20
    n_perm: int = 1000
    exclude_massive: bool = False
    amplification: str = "column"

    def __post_init__(self) -> None:
        for name, low in (("chunks", 1), ("seq_len", 2), ("batch_size", 1), ("seed", 0), ("null_samples", 1),
                          ("null_chunks", 0), ("extras_chunks", 0), ("probe_seqs", 1), ("probe_len", 1), ("funnel_rank", 1),
                          ("topk", 1), ("n_perm", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                flag = "--" + name.replace("_", "-")
                raise InputError(f"{name} = {value!r} is invalid; pass {flag} as an integer >= {low}.")
        if self.dtype not in DTYPES:
            raise InputError(f"dtype {self.dtype!r} is not supported; use one of {', '.join(DTYPES)}.")
        self.attention_options()  # validates the stage options
        self.jacobian_options()
        self.topology_options()
        if not self.model:
            raise InputError("model is empty; pass --model smollm2-135m, a hub id, a folder or a .gguf file.")
        if not self.text:
            raise InputError("text is empty; pass --text python-docs, wikitext-2 or a file path.")

    def attention_options(self) -> "AttentionOptions":
        """The attention-stage options of this configuration (validated)."""
        from .attention.analysis import AttentionOptions

        names = ("null_mode", "null_samples", "null_chunks", "extras_chunks", "certify", "probe_seqs", "probe_len")
        return AttentionOptions(**{n: getattr(self, n) for n in names}, seed=self.seed)

    def jacobian_options(self) -> "JacobianOptions":
        """The jacobian-stage options of this configuration (validated)."""
        from .jacobian.stage import MODES, JacobianOptions

        modes = MODES if self.jacobian_mode == "both" else (self.jacobian_mode,)
        revisions = tuple(r.strip() for r in self.revisions.split(",") if r.strip())
        return JacobianOptions(modes=modes, positions=self.positions, funnel_rank=self.funnel_rank,
                               null=self.null, revisions=revisions, seed=self.seed)

    def topology_options(self) -> "TopologyOptions":
        """The topology-stage options of this configuration (validated); the amplification
        comes from the isolated operators when that mode runs, else from the first mode."""
        from .topology.stage import TopologyOptions

        modes = self.jacobian_options().modes
        return TopologyOptions(topk=self.topk, n_perm=self.n_perm, exclude_massive=self.exclude_massive,
                               amplification=self.amplification, seed=self.seed,
                               mode="isolated" if "isolated" in modes else modes[0])

    def to_dict(self) -> dict[str, Any]:
        """The configuration as a plain dict (JSON-serialisable)."""
        return dataclasses.asdict(self)

    def hash(self) -> str:
        """A short stable hash of the configuration (16 hex digits of SHA-256)."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @classmethod
    def from_sources(cls, toml_path: str | Path | None = None, **overrides: Any) -> "RunConfig":
        """Build a configuration from an optional TOML file, then explicit overrides.

        ``None`` overrides are ignored, so unset command-line flags keep the file's value.

        Raises
        ------
        InputError
            If the file is missing or malformed, or has unknown keys or bad values.
        """
        values: dict[str, Any] = {}
        if toml_path is not None:
            path = Path(toml_path)
            try:
                values = tomllib.loads(path.read_text())
            except FileNotFoundError:
                raise InputError(f"config file {path} does not exist; pass an existing TOML file.") from None
            except tomllib.TOMLDecodeError as exc:
                raise InputError(f"config file {path} is not valid TOML ({exc}).") from None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise InputError(f"unknown config key {unknown[0]!r}; known keys: {', '.join(sorted(known))}.")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
