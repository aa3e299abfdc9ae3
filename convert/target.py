"""`python -m convert target HF_DIR OUT_DIR`: the Qwen3.5/3.6 target, HF safetensors -> Orbax."""

from __future__ import annotations

import argparse
import sys
import time

DTYPES = ("bfloat16", "float16", "float32")


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "target", help="convert the Qwen3.5/3.6 target model",
        description="Convert a Hugging Face Qwen3.5/3.6 checkpoint (Qwen3_5ForConditionalGeneration or "
                    "Qwen3_5ForCausalLM, safetensors only) into OUT_DIR: config.json, tokenizer files, "
                    "the Flax params under params/ (Orbax) and the raw mtp.* tensors if present. "
                    "Vision weights are dropped.")
    add_io_arguments(p, "HF_DIR", "dir with config.json and *.safetensors (+ index)")
    p.set_defaults(func=run)
    return p


def add_io_arguments(p, hf_metavar: str, hf_help: str) -> None:
    """The arguments every conversion takes."""
    p.add_argument("hf_dir", metavar=hf_metavar, help=hf_help)
    p.add_argument("out_dir", metavar="OUT_DIR", help="output dir; written atomically")
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="parameter dtype (default: %(default)s)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace OUT_DIR if it exists and is an empty dir or an earlier conversion of the same kind "
                        "(it has jaxspec.json); a dir of other files is never replaced")


def convert_to(args, work, kind, protected: dict) -> int:
    """Run `work()` (load + save, returning the written dir) with the shared CLI behaviour: refuse an OUT_DIR
    that the save of a `kind` model would refuse (convert/store.py `check_out_dir`: an existing one without
    --overwrite, one that is or holds a `protected` dir ({what: dir}), ...) before a conversion that can take
    minutes, and report errors without a traceback: an OUT_DIR that cannot be written (read-only, a full disk) is
    an OutDirError naming it, and the save leaves nothing half-written."""
    from convert.hf import CheckpointError
    from convert.store import OutDirError, check_out_dir
    from jaxspec.config import ConfigError

    t0 = time.perf_counter()
    try:
        check_out_dir(kind, args.out_dir, protected, overwrite=args.overwrite)
        out = work()
    except (CheckpointError, ConfigError, FileExistsError, OutDirError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:      # a source file that could not be read (OUT_DIR's own failures are OutDirError)
        print(f"error: {e.filename}: {e.strerror or e}" if e.filename else f"error: {e}", file=sys.stderr)
        return 2
    print(f"convert: wrote {out} ({args.dtype}, {time.perf_counter() - t0:.1f}s)", file=sys.stderr)
    return 0


def run(args) -> int:
    # Imported here so that `--help` does not pay for importing jax.
    from convert.hf import load_target
    from convert.store import TARGET, save_converted

    def work():
        model = load_target(args.hf_dir, dtype=args.dtype, progress=True)
        return save_converted(model, args.out_dir, args.hf_dir, overwrite=args.overwrite, progress=True)
    return convert_to(args, work, TARGET, {"source checkpoint": args.hf_dir})
