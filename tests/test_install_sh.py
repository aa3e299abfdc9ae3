"""./install.sh: an argument it does not know is refused before anything is made."""

import shutil
import subprocess
import sys
from pathlib import Path


def test_an_unknown_extra_is_refused_before_the_venv_is_made(tmp_path):
    """`./install.sh tests` (for `test`) made .venv first, then refused the extra. Run in a copy of the script alone,
    so that nothing can be installed: the refusal names the argument, and no .venv appears."""
    script = tmp_path / "install.sh"
    shutil.copy(Path(__file__).resolve().parents[1] / "install.sh", script)
    out = subprocess.run(["bash", str(script), "tests"], capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1] == "install.sh: unknown extra 'tests' (use: test, cuda)", out.stderr
    assert not (tmp_path / ".venv").exists()
