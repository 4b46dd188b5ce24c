"""Removing one hub revision from the local Hugging Face cache (``depthlens census
--delete-cache``), so a census over hundreds of checkpoints keeps one on disk at a time."""

from __future__ import annotations

from pathlib import Path

__all__ = ["delete_cached_revision"]


def delete_cached_revision(repo_id: str, revision: str, cache_dir: str | Path | None = None) -> int:
    """Delete the snapshot of ``repo_id`` at ``revision`` (a branch or tag name, or a commit
    hash or its prefix) from the hub cache, with the files only it uses, and return the bytes
    freed (0 when it is not cached). Files shared with other cached revisions stay.

    Parameters
    ----------
    repo_id : str
        The model's hub id.
    revision : str
        The revision as the census loaded it.
    cache_dir : str or Path, optional
        The hub cache (default: the one ``huggingface_hub`` uses, ``HF_HUB_CACHE``).
    """
    from huggingface_hub import scan_cache_dir

    try:
        info = scan_cache_dir(cache_dir)
    except Exception:  # noqa: BLE001 - no cache (yet) or an unreadable one: nothing to delete
        return 0
    hashes = [rev.commit_hash for repo in info.repos if repo.repo_id == repo_id and repo.repo_type == "model"
              for rev in repo.revisions if revision in rev.refs or rev.commit_hash.startswith(revision)]
    if not hashes:
        return 0
    strategy = info.delete_revisions(*hashes)
    strategy.execute()
    return int(strategy.expected_freed_size)
