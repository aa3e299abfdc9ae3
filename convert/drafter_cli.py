"""`python -m convert drafter HF_DRAFT_DIR OUT_DIR`: the DFlash drafter, HF safetensors -> Orbax.

The loader itself lives in convert/drafter.py; this module only holds the subcommand, so that
`python -m convert --help` does not import jax (convert/drafter.py does at import time).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from convert.target import add_io_arguments, convert_to


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "drafter", help="convert a DFlash drafter",
        description="Convert a z-lab DFlash drafter checkpoint (config.json + model.safetensors, or shards listed "
                    "by model.safetensors.index.json) into OUT_DIR: config.json and the Flax params under params/ "
                    "(Orbax). With --target, first check that the drafter fits that target model; without it, "
                    "nothing checks the fit until the drafter runs with its target.")
    add_io_arguments(p, "HF_DRAFT_DIR", "dir with config.json and model.safetensors (or its shards with "
                                        "model.safetensors.index.json)")
    p.add_argument("--target", metavar="TARGET_DIR",
                   help="the target this drafter will run on (HF or converted dir; only its config.json is "
                        "read): refuse a drafter whose hidden size, vocabulary, tapped layers or mask token "
                        "do not fit it. Without --target no fit check against the target happens")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    # Imported here so that `--help` does not pay for importing jax.
    from convert.drafter import DRAFTER, load_drafter, save_drafter
    from jaxspec.config import ConfigError, load_target_config
    from jaxspec.drafter_config import check_pair, load_drafter_config

    def work():
        if args.target is not None:
            # Only the configs are needed, so a mismatch is reported before any weight is read.
            if not Path(args.target).exists():
                raise ConfigError(f"--target {args.target}: no such directory")
            target_cfg = load_target_config(args.target)
            try:
                check_pair(load_drafter_config(args.hf_dir, dtype=args.dtype), target_cfg)
            except ConfigError as e:
                raise ConfigError(f"drafter {args.hf_dir} does not fit target {args.target}: {e}") from None
        drafter = load_drafter(args.hf_dir, dtype=args.dtype)
        return save_drafter(drafter, args.out_dir, args.hf_dir, overwrite=args.overwrite, progress=True)
    protected = {"source checkpoint": args.hf_dir}
    if args.target is not None:
        protected["--target"] = args.target
    return convert_to(args, work, DRAFTER, protected)
