"""Run directories (manifest, tables, arrays, units, resume) and atomic writes."""

from .directory import (
    FORMAT,
    FORMAT_VERSION,
    Mode,
    RunDirectory,
    check_target,
    not_a_run,
    read_manifest,
    remove_run_files,
    with_ident,
)

__all__ = ["FORMAT", "FORMAT_VERSION", "Mode", "RunDirectory", "check_target", "not_a_run", "read_manifest",
           "remove_run_files", "with_ident"]
