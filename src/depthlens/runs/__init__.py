"""Run directories (manifest, tables, arrays, units, resume), atomic writes, and the run reader
(:class:`~depthlens.runs.tables.RunTables`) that the report, the census and the API share."""

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
from .tables import RunTables

__all__ = ["FORMAT", "FORMAT_VERSION", "RunMode", "RunDirectory", "RunTables", "check_run_directory", "check_target",
           "not_a_run", "read_manifest", "remove_run_files"]
