"""Writing files and directories whole: a reader sees the old content or the new one, never a part."""

from __future__ import annotations

import os
import re
import shutil
import sys
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


# What a write of the directory NAME leaves beside it while it runs: `.NAME.tmp-PID-XXXXXXXXXXXX`, the new dir being
# written, and `.NAME.old-PID-XXXXXXXXXXXX`, the previous NAME that `replace_dir` moved aside (the writing process's
# id, then a uuid's 12 hex digits; conversions before session 64 wrote no process id, exports before session 70
# named theirs `.NAME.new-XXXXXXXX`). A write into such a dir (jaxspec.train's exports into its staged dir) leaves
# nested names, `..NAME.tmp-A-X.tmp-B-Y`: they belong to NAME too.
_LEFTOVER = re.compile(r"\.(?P<name>.+)\.(?:(?P<kind>tmp|old)-(?:(?P<pid>\d+)-)?[0-9a-f]{12}|new-[0-9a-f]{8})")


def temp_sibling(out: Path, kind: str = "tmp") -> Path:
    """A new name beside `out`: to write its next content under (`.NAME.tmp-PID-XXXXXXXXXXXX`), or with kind "old"
    to move its previous content aside to (`replace_dir`)."""
    return out.parent / f".{out.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def is_leftover(name: str) -> bool:
    """Whether `name` is that of a dir a write of its sibling leaves while it runs (`temp_sibling`, `replace_dir`)."""
    return _LEFTOVER.fullmatch(name) is not None


def _owner(name: str) -> tuple[str, list[int]] | None:
    """(the dir whose write left the leftover `name`, nested writes undone; the process ids in the name), or None
    where `name` is no leftover."""
    pids, m = [], _LEFTOVER.fullmatch(name)
    if m is None:
        return None
    while m is not None:
        name = m["name"]
        pids += [int(m["pid"])] if m["pid"] else []
        m = _LEFTOVER.fullmatch(name)
    return name, pids


def real_dir(out: str | Path) -> Path:
    """`out`, or the directory it links to: a write replaces that directory, not the link (which would leave the
    linked one as it was and put the new content on the link's file system)."""
    out = Path(out)
    return out.resolve() if out.is_symlink() and out.is_dir() else out


def stale_leftovers(out: Path) -> list[Path]:
    """The dirs beside `out` that writes of it left behind and whose processes are all gone (SIGKILL, a power cut:
    no chance to clean up); a running write's (another process writing the same dir) are left alone. Process ids
    are this host's: a writer on another host (a shared file system) or in another PID namespace looks gone."""
    stale = []
    for p in out.parent.iterdir() if out.parent.is_dir() else ():
        owner = _owner(p.name)
        if owner and owner[0] == out.name and p.is_dir() and not p.is_symlink() and \
                not any(_running(pid) for pid in owner[1]):
            stale.append(p)
    return sorted(stale)


def clear_leftovers(out: Path, who: str) -> None:
    """Before a write of `out`: where `out` is missing because a write was killed between `replace_dir`'s two
    renames, its previous content (moved aside) is put back under its name; every other stale leftover
    (`stale_leftovers`) is removed. Each is reported on stderr, prefixed by `who`. Another write clearing the same
    leftovers at the same time is no error."""
    stale = stale_leftovers(out)
    aside = [p for p in stale if (m := _LEFTOVER.fullmatch(p.name))["name"] == out.name and m["kind"] == "old"]
    if aside and not (out.exists() or out.is_symlink()):
        try:
            back = max(aside, key=lambda p: p.stat().st_ctime)       # the last one moved aside (a rename sets ctime)
            os.rename(back, out)
            print(f"{who}: put {back} back as {out}: an interrupted write had moved it aside", file=sys.stderr,
                  flush=True)
            stale.remove(back)
        except FileNotFoundError:       # another write got there first
            pass
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
        if p.exists():
            print(f"{who}: could not remove {p}, left behind by an interrupted write of {out}", file=sys.stderr,
                  flush=True)
        else:
            print(f"{who}: removed {p}, left behind by an interrupted write of {out}", file=sys.stderr, flush=True)


def _running(pid: int) -> bool:
    """Whether a process `pid` exists on this host (one we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):     # none, or no process can have that id
        return False
    except PermissionError:                         # another user's
        return True
    return pid > 0


def replace_dir(new: Path, out: Path) -> None:
    """Rename the finished directory `new` to `out`; an old `out` is moved aside first and removed only once `new`
    is in its place (were the rename to fail, the old one is put back)."""
    if not (out.exists() or out.is_symlink()):
        os.rename(new, out)
        return
    old = temp_sibling(out, "old")      # its process id tells a killed write's from a running one's
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
