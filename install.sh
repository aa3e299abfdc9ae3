#!/usr/bin/env bash
# Creates .venv with a Python >= 3.12 found on this machine and installs jaxspec into it.
#   ./install.sh         runtime only (CPU JAX)
#   ./install.sh test    plus the test extra (pytest, pytest-xdist, torch, transformers) and z-lab's `dflash` reference
#   ./install.sh cuda    plus jax[cuda13] for NVIDIA GPUs
# Set PYTHON=/path/to/python3.12 to choose the interpreter yourself.
set -euo pipefail
cd "$(dirname "$0")"
extra="${1:-}"
case "$extra" in    # before anything is made: a typo ('tests') once left a new .venv behind
  ""|test|cuda) ;;
  *) echo "install.sh: unknown extra '$extra' (use: test, cuda)" >&2; exit 2 ;;
esac

ok() { "$@" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; }
py="${PYTHON:-}"
if [ -z "$py" ]; then
  for c in python3.12 python3.13 python3 python; do
    if command -v "$c" >/dev/null && ok "$c"; then py="$(command -v "$c")"; break; fi
  done
fi
if [ -z "$py" ] && command -v pyenv >/dev/null; then
  # pyenv may have 3.12+ installed without selecting it (plain `python3.12` then fails).
  # 3.12 first (the GPU image's version), then newer ones.
  for v in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.12' | sort -V -r) \
           $(pyenv versions --bare 2>/dev/null | grep -E '^3\.(1[3-9])' | sort -V); do
    c="$(pyenv root)/versions/$v/bin/python3"
    if [ -x "$c" ] && ok "$c"; then py="$c"; break; fi
  done
fi
if [ -z "$py" ]; then
  echo "install.sh: no Python >= 3.12 found (tried python3.12, python3.13, python3, pyenv versions)." >&2
  echo "Install one (e.g. 'pyenv install 3.12', 'uv python install 3.12' or your OS package) or set PYTHON=..." >&2
  exit 1
fi
echo "install.sh: using $py ($("$py" --version))" >&2
# The test extra pulls PyPI's torch (a CUDA build with its NVIDIA libraries, ~6 GB in .venv).
need_gb=2; [ "$extra" = test ] && need_gb=8; [ "$extra" = cuda ] && need_gb=5
free_gb=$(df -Pk . | awk 'NR==2 {print int($4 / 1048576)}')
if [ ! -d .venv ] && [ "$free_gb" -lt "$need_gb" ]; then
  echo "install.sh: only ${free_gb} GB free on $(df -P . | awk 'NR==2 {print $6}'); './install.sh $extra' needs about ${need_gb} GB." >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$py" -m venv .venv
# No pip cache: on a fresh machine it only doubles the disk the wheels take.
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check --no-cache-dir)
# The GPU image runs jax 0.11.2: pin it so CPU tests run the same JAX.
pins=("jax==0.11.2" "jaxlib==0.11.2")
case "$extra" in
  "") "${pip[@]}" -e . "${pins[@]}" ;;
  test) "${pip[@]}" -e ".[test]" "${pins[@]}"
        "${pip[@]}" --no-deps "dflash==0.1.0" ;;  # its metadata pins unrelated packages
  cuda) "${pip[@]}" -e ".[cuda]" "jax[cuda13]==0.11.2" ;;
esac
echo "install.sh: done; run .venv/bin/python -m jaxspec.generate --help" >&2
