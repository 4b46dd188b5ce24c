"""Run directories (manifest, tables, arrays, units, resume) and atomic writes."""

from .directory import (
    FORMAT,
    FORMAT_VERSION,
    RunMode,
    RunDirectory,
    check_run_directory,
    check_target,
    not_a_run,
    read_manifest,
    remove_run_files,
)

__all__ = ["FORMAT", "FORMAT_VERSION", "RunMode", "RunDirectory", "check_run_directory", "check_target", "not_a_run",
           "read_manifest", "remove_run_files"]
