"""Where a result came from: the commit of the code that made it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def git_info() -> dict:
    """The commit the running code came from, and whether tracked files differ from it. JAXSPEC_COMMIT (and
    JAXSPEC_DIRTY) win when set: a run from an exported snapshot sits inside a checkout whose own .git may be
    another commit, or none."""
    if os.environ.get("JAXSPEC_COMMIT"):
        return dict(commit=os.environ["JAXSPEC_COMMIT"],
                    dirty=os.environ.get("JAXSPEC_DIRTY", "unknown") not in ("0", "false", "False"), source="env")
    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True,
                              timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, check=True, timeout=10)
        return dict(commit=head.stdout.strip(), dirty=bool(dirty.stdout.strip()), source="git")
    except (OSError, subprocess.SubprocessError):
        return dict(commit="unknown", dirty=True, source="none")
