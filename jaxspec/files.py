"""Writing files and directories whole: a reader sees the old content or the new one, never a part."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write `data` (text or bytes) to `path` through a temporary sibling renamed into place, so that an interrupted
    write leaves the previous file whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def replace_dir(new: Path, out: Path) -> None:
    """Rename the finished directory `new` to `out`; an old `out` is moved aside first and removed only once `new`
    is in its place (were the rename to fail, the old one is put back)."""
    if not (out.exists() or out.is_symlink()):
        os.rename(new, out)
        return
    # Named like the save's temp dirs (the process id, then a uuid's 12 hex digits), so that one a killed process
    # left behind can be told from a running one's (convert/store.py `_stale_temp_dirs` removes them).
    old = out.parent / f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    os.rename(out, old)
    try:
        os.rename(new, out)
    except BaseException:
        os.rename(old, out)
        raise
    if old.is_dir() and not old.is_symlink():
        shutil.rmtree(old)
    else:
        old.unlink()


# Orbax's writer globs the paths it writes (jax 0.11 / orbax-checkpoint 0.12): under a dir named `a[1]` it writes
# no arrays, under a backslash it writes them elsewhere, and both times reports success.
ORBAX_UNSAFE = "[]\\"


def orbax_path_problem(path: str | Path) -> str | None:
    """Why Orbax cannot write checkpoints under `path` (the characters of it that it globs); None where it can."""
    odd = sorted(set(str(Path(path).absolute())) & set(ORBAX_UNSAFE))
    if not odd:
        return None
    return (f"has {' '.join(odd)} in its path, which Orbax's writer takes as a glob pattern (its checkpoints "
            "would not restore); choose a path without them")


def blocking_file(path: str | Path, *, parents_only: bool = False) -> Path | None:
    """The file (or dangling link) that keeps the directory `path` from being made or used: the nearest of `path`
    (unless `parents_only`) and its parents that exists, where that one is not a directory; None where there is none."""
    path = Path(path).absolute()
    for p in (path.parents if parents_only else (path, *path.parents)):
        if p.is_dir():
            return None
        if p.exists() or p.is_symlink():
            return p
    return None
