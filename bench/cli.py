"""What the benchmark CLIs share to refuse bad flags before any work: numbers in range, and output paths that can
be written (checked at parse time, not after minutes of timing)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path


def at_least(low: int, kind=int):
    """An argparse `type` that takes finite numbers >= low (its message names the bound; argparse names the flag)."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}")
        if isinstance(v, float) and not math.isfinite(v):     # nan < low is False: refused here, not by the bound
            raise argparse.ArgumentTypeError(f"must be a finite number >= {low}, got {text}")
        if v < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {text}")
        return v
    parse.__name__ = f"{kind.__name__} >= {low}"
    return parse


def writable_file(ap: argparse.ArgumentParser, flag: str, path: str | None, *, must_not_exist: bool = False) -> None:
    """The parser's error naming `flag` unless `path` can be written as a file: not a directory, in a directory
    that exists (or can be made) and is writable, and, with must_not_exist, not there yet. None passes."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        ap.error(f"{flag} {path}: is a directory; name a file")
    if must_not_exist and p.exists():
        ap.error(f"{flag} {path}: exists; name a new file")
    writable_dir(ap, flag, path, p.parent)


def writable_dir(ap: argparse.ArgumentParser, flag: str, path: str, d: Path) -> None:
    """The parser's error naming `flag` and `path` unless directory `d` exists and is writable, or its nearest
    existing parent is (the missing ones are made when written)."""
    while not d.exists() and d != d.parent:
        d = d.parent
    if not d.is_dir():
        ap.error(f"{flag} {path}: {d} is not a directory")
    if not os.access(d, os.W_OK | os.X_OK):
        ap.error(f"{flag} {path}: {d} is not writable")


def write_json(path: str | Path, data) -> None:
    """`data` as JSON at `path`, its parent made if missing, through a temporary sibling moved into place (an
    interrupted or failed write leaves the previous file whole)."""
    from jaxspec.files import write_atomic
    write_atomic(path, json.dumps(data, indent=1) + "\n")


class StagedResult:
    """A result JSON written whole after each phase (`save`), marked "complete": false by its caller until `finish`.
    A finished earlier result at `out` (any file not so marked) is never lost: the phases then go to OUT.partial,
    and `out` is replaced only by `finish`, which removes OUT.partial. Without one, the phases go to `out` itself."""

    def __init__(self, out: str | Path):
        self.out = Path(out)
        self.partial = self.out.with_name(self.out.name + ".partial")
        self.keeps_earlier = self.out.exists() and not _marked_incomplete(self.out)
        self.path = self.partial if self.keeps_earlier else self.out

    def save(self, data) -> None:
        write_json(self.path, data)

    def finish(self, data) -> None:
        write_json(self.out, data)
        self.path = self.out
        self.partial.unlink(missing_ok=True)


def _marked_incomplete(path: Path) -> bool:
    try:
        return json.loads(path.read_text()).get("complete") is False
    except (OSError, ValueError, AttributeError):
        return False


def exit_with(main) -> None:
    """`python -m bench.X`: exits with main()'s status (a returned result, not an int, is success). Ctrl-C prints
    "interrupted" and exits 130, without a traceback; a results file keeps what its last finished phase saved
    (marked "complete": false, or in OUT.partial beside an earlier finished result)."""
    try:
        status = main()
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        raise SystemExit(130) from None
    raise SystemExit(status if isinstance(status, int) else 0)
