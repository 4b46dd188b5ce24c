"""Run directories (manifest, tables, arrays, units, resume) and atomic writes."""

from .directory import Mode, RunDirectory, check_target, read_manifest, with_ident

__all__ = ["Mode", "RunDirectory", "check_target", "read_manifest", "with_ident"]
