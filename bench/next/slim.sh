#!/bin/bash
# The device takes a working tree of at most 64 MiB; this one tracks ~137 MB (the shipped pair in jaxspec/demo and
# trained models under bench/results). Before a device call:
#   bash bench/next/slim.sh on [PATH ...]   takes jaxspec/demo and bench/results out of the index (the files stay on
#                                           disk, ignored through .git/info/exclude) except the PATHs the call needs
# and after it (before any commit):
#   bash bench/next/slim.sh off             puts them back; `git status` is then as before
set -e
cd "$(git rev-parse --show-toplevel)"
EX=.git/info/exclude
case "$1" in
  on)
    shift
    git rm -r -q --cached jaxspec/demo bench/results
    for p in "$@"; do git reset -q HEAD -- "$p"; done
    printf '/jaxspec/demo/\n/bench/results/\n' >> $EX
    echo "slim: $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) bytes tracked (the limit, with carried paths: 67108864)";;
  off)
    git reset -q HEAD -- jaxspec/demo bench/results
    sed -i '\#^/jaxspec/demo/$#d;\#^/bench/results/$#d' $EX
    git status --short | head;;
  *) echo "usage: bash bench/next/slim.sh on [PATH ...] | off"; exit 2;;
esac
