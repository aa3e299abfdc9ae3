"""Command line generation: `python -m jaxspec.generate --model DIR --prompt "..."`.

Without --model it runs the small trained demo pair shipped with jaxspec (jaxspec/demo/: a Qwen3.6-architecture
target trained on the Python standard library and its DFlash drafter, made by `python -m jaxspec.train pair`):
code completion with AR and with DDTree, both timed, with the acceptance length and the speedup. Where the
demo pair is missing it falls back to a tiny random-weight model with the real Qwen3.6 tokenizer, so that the
whole path (tokenizer, prefill, compiled decode loop, streaming) still runs on any machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from jaxspec.config import FULL, LINEAR, TargetConfig
from jaxspec.files import blocking_file
from jaxspec.sampling import Sampling, cut_problem, seed_problem

METHODS = ("ar", "dflash", "ddtree", "mtp")
DEMO_ENV = "JAXSPEC_DEMO_DIR"


# 63 draft nodes + the root verify as 64 rows: on the H200 a real-shape DDTree round costs 24.20 ms at 63 and 26.14
# at 64 (65 rows run the tree delta rule as 80 and move XLA's MLP to other cuBLAS kernels), for one fewer node, the
# least likely; the demo pair's tau per round is then 3.28 against 3.29
# (bench/results/2026-12-02-h200-s24-tiles-eval64/).
DEFAULT_BUDGET = 63
# On a CPU a verify costs in proportion to its rows (the demo target is compute-bound there), so a small tree wins:
# session 20's demo pair's DDTree at budgets 4 / 8 / 16 / 63 ran at 0.55x / 0.58x / 0.63x / 0.35x AR's speed on 16
# held-out prompts (bench/results/2026-12-02-cpu-s25-budgets/); session 30's pair at 4 / 8 / 16 / 32 / 63 at 0.66x /
# 0.92x / 0.78x / 0.68x / 0.53x, tau 2.69 / 3.20 / 3.62 / 3.85 / 4.12, and 8 and 16 tie over three runs (0.88x each,
# bench/results/2026-12-03-h200-s30-live/cpu-budgets/); session 34's drafter at 8 / 16 / 32 / 64 at 0.93x / 0.88x /
# 0.74x / 0.49x in one run, tau 3.30 / 3.72 / 4.01 / 4.32 (bench/results/2026-12-03-h200-s34/cpu-budgets/).
# With blocks of 8 (CPU_BLOCK) the drafter runs on 8 rows and trees are at most 7 deep; session 34's pair then ran
# DDTree(8) at 1.07x AR (fp32 drafter) and 1.15x / 1.09x (bf16 drafter) on the 16 prompts, tau 3.16-3.17, where block
# 16's best was 0.97x; on the 48, 0.92x (bench/results/2026-12-03-h200-s34/cpu-block8/).
CPU_BUDGET = 8
CPU_BLOCK = 8
# The demo's comparison times each method this many times, in turn, and reports the median run: on a
# 2-core host single runs of the default gave 0.83x-1.07x AR minutes apart, the median of three 1.01x-1.05x (session 46,
# bench/results/2026-12-04-cpu-demo-repeats-session46.log).
REPEATS = 3
MTP_TOKENS = 3
ROUNDS_PER_CALL = 8
# The flags that size each speculative method's draft (and verified tree), for the out-of-memory advice.
DRAFT_FLAGS = {"dflash": ("--block-size",), "ddtree": ("--budget", "--block-size"), "mtp": ("--mtp-tokens",)}


def default_budget(backend: str) -> int:
    """--budget's default on `backend` (jax.default_backend())."""
    return CPU_BUDGET if backend == "cpu" else DEFAULT_BUDGET


def default_block(backend: str, trained: int) -> int:
    """--block-size's default on `backend` for a drafter trained with blocks of `trained`: that block on a GPU, at
    most CPU_BLOCK on a CPU, where every drafted and verified row costs compute."""
    return min(CPU_BLOCK, trained) if backend == "cpu" else trained


def readable(ids: list[int], stops) -> list[int]:
    """The generated ids whose text is printed: without the stop token that ends them (a chat reply's <|im_end|>),
    which the counts include."""
    return ids[:-1] if ids and ids[-1] in stops else ids


def demo_dir() -> Path:
    """Where the demo pair lives: $JAXSPEC_DEMO_DIR, else jaxspec/demo (target/ and drafter/)."""
    return Path(os.environ.get(DEMO_ENV) or Path(__file__).resolve().parent / "demo")


def demo_available() -> bool:
    d = demo_dir()
    return (d / "target" / "config.json").is_file() and (d / "drafter" / "config.json").is_file()


def distributed_args(env) -> dict:
    """jax.distributed.initialize's num_processes / process_id from JAX_NUM_PROCESSES / JAX_PROCESS_ID where set
    (jax reads JAX_COORDINATOR_ADDRESS itself, and detects SLURM, Open MPI and Kubernetes on its own)."""
    kw = {}
    for var, key, low in (("JAX_NUM_PROCESSES", "num_processes", 1), ("JAX_PROCESS_ID", "process_id", 0)):
        if env.get(var):
            try:
                kw[key] = int(env[var])
            except ValueError:
                raise ValueError(f"{var}={env[var]!r} is not an integer") from None
            if kw[key] < low:
                raise ValueError(f"{var}={kw[key]} must be >= {low}")
    if "process_id" in kw and kw["process_id"] >= kw.get("num_processes", kw["process_id"] + 1):
        raise ValueError(f"JAX_PROCESS_ID={kw['process_id']} must be below JAX_NUM_PROCESSES={kw['num_processes']}")
    return kw


def tiny_random_config() -> TargetConfig:
    """Qwen3.6 layout (3 GDN + 1 gated attention) at toy width, with the real 248320-token vocabulary."""
    return TargetConfig(vocab_size=248320, hidden_size=64, intermediate_size=128,
                        layer_types=(LINEAR, LINEAR, LINEAR, FULL), num_heads=4, num_kv_heads=2, head_dim=32,
                        rotary_dim=8, rope_theta=1e7, linear_num_key_heads=2, linear_num_value_heads=6,
                        linear_key_head_dim=16, linear_value_head_dim=16, conv_kernel=4,
                        eos_token_ids=(248046, 248044), dtype="float32")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jaxspec.generate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="Hugging Face Qwen3.5/3.6 directory (config.json + safetensors) or a "
                   "directory written by `python -m convert target`. Default: the demo pair (target and drafter, "
                   f"jaxspec/demo or ${DEMO_ENV}); where it is missing, a tiny random-weight model")
    p.add_argument("--prompt", default="def fibonacci(n):", help="prompt text (default: %(default)r)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--no-thinking", action="store_true", help="with --chat: close the <think> block empty "
                   "(refused without --chat)")
    p.add_argument("--method", choices=METHODS, default=None,
                   help="decoding method (default: ar; without --model, the demo pair runs ar and ddtree and "
                        "compares them)")
    p.add_argument("--draft", help="DFlash drafter, for --method dflash or ddtree: its Hugging Face directory "
                   "(config.json + model.safetensors, or shards with model.safetensors.index.json) or one written "
                   "by `python -m convert drafter`. Default: the demo pair's drafter when no --model is given; "
                   "required otherwise")
    p.add_argument("--block-size", type=int, default=None,
                   help="DFlash/DDTree block size: the anchor plus block_size - 1 drafted depths "
                        f"(default: the drafter's on a GPU; at most {CPU_BLOCK} on a CPU)")
    p.add_argument("--budget", type=int, default=None,
                   help=f"DDTree: draft tree nodes beyond the root (default: {DEFAULT_BUDGET} on a GPU, where with "
                        f"the root a verify is 64 rows, a whole number of the kernels' 16-row tiles; {CPU_BUDGET} on "
                        "a CPU, where each row costs compute)")
    p.add_argument("--mtp-tokens", type=int, default=None,
                   help=f"MTP: tokens the checkpoint's own MTP head drafts per round (default: {MTP_TOKENS})")
    p.add_argument("--max-new-tokens", type=int, default=64,
                   help="new tokens to generate after the prompt (each sequence's), the prefill's first token "
                        "included; an end-of-sequence token, counted among them, ends it sooner unless --ignore-eos "
                        "(default: %(default)s)")
    p.add_argument("--prefill-chunk", type=int, default=None, metavar="N",
                   help="prompt tokens per compiled prefill piece (default: 1024, the engine's PREFILL_CHUNK). Longer "
                        "pieces read the weights fewer times and take more memory for their activations; each piece "
                        "length compiles once")
    p.add_argument("--max-len", type=int, default=None,
                   help="context length to allocate, >= prompt + max-new-tokens + tree size (default: that sum, "
                        "rounded up to a multiple of 16, and at most 1/8 more from 128 slots up)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0,
                   help="with --temperature > 0: keep the k most likely tokens (default: 0 = off)")
    p.add_argument("--top-p", type=float, default=1.0,
                   help="with --temperature > 0: nucleus sampling mass (default: 1.0 = off)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the sampling noise (and of the tiny random model's weights) (default: %(default)s)")
    p.add_argument("--dtype", choices=("bfloat16", "float32", "float16"), default=None,
                   help="parameter/activation dtype (default: the checkpoint's; float32 for the demo pair and the tiny "
                        "model)")
    p.add_argument("--draft-dtype", choices=("bfloat16", "float32", "float16"), default=None,
                   help="the drafter's dtype (default: bfloat16 under a float32 target on a GPU, else the target's). "
                        "The drafter only proposes and the target checks every token, so e.g. a bfloat16 drafter "
                        "under a float32 target changes the speed and the acceptance, never the output")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at end-of-sequence tokens")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"the demo's comparison (no --model, no --method): timed runs of each method, taken in turn; "
                        f"each line gives the median run (default: {REPEATS}). Runs of well under a second on a "
                        "shared CPU vary by tens of percent")
    p.add_argument("--rounds-per-call", type=int, default=None,
                   help=f"decode rounds per compiled call between streamed prints (default: {ROUNDS_PER_CALL}; the "
                        "demo's comparison, which streams nothing: all of them in one call)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree: heads, GDN groups, MLP and "
                   "vocabulary split over this many devices (default: %(default)s)")
    p.add_argument("--dp", type=int, default=1, help="data-parallel degree: the prompt runs as a batch of this "
                   "many sequences, one per data shard (default: %(default)s)")
    p.add_argument("--distributed", action="store_true", help="call jax.distributed.initialize() first "
                   "(multi-host: run the same command on every host; see README)")
    p.add_argument("--compile-cache", default=None, metavar="DIR|off",
                   help="keep compiled programs between runs (JAX's persistent compilation cache): a later run "
                        "with the same model, method and shapes skips most compiling. Default: "
                        "$JAX_COMPILATION_CACHE_DIR where set, else $XDG_CACHE_HOME/jaxspec/xla "
                        "(~/.cache/jaxspec/xla); off: none")
    return p


def compile_cache_dir(flag: str | None, env) -> str | None:
    """The directory `--compile-cache` asks for: "" for off (no cache, even with $JAX_COMPILATION_CACHE_DIR
    set), None to leave JAX's own setting ($JAX_COMPILATION_CACHE_DIR, which JAX reads itself)."""
    if flag == "off":
        return ""
    if flag:
        return flag
    if "JAX_COMPILATION_CACHE_DIR" in env:
        return None
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jaxspec", "xla")


def main(argv=None) -> int:
    """The command line; Ctrl-C ends it with "interrupted" and status 130, a reader that closed the output (`| head`)
    with status 141 (as a shell reports SIGPIPE), neither with a traceback."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        try:                    # so that the interpreter's last flush of stdout does not fail the same way
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):       # a stdout that is no file (a test's capture): nothing to flush
            pass
        return 141


def _main(argv) -> int:
    from pallas_kernels import dispatch
    args = dispatch.parse_args(parser(), argv)      # JAXSPEC_* flags checked before any loading
    demo = args.model is None and demo_available()
    compare = demo and args.method is None
    if args.method is None:
        args.method = "ddtree" if compare else "ar"
    if demo and args.method in ("dflash", "ddtree") and not args.draft:
        args.draft = str(demo_dir() / "drafter")
    try:
        sampling = Sampling(args.temperature, args.top_k, args.top_p)
    except ValueError as e:
        parser().error(str(e))
    if problem := cut_problem(sampling):
        parser().error(problem)
    if args.no_thinking and not args.chat:
        parser().error("--no-thinking only applies with --chat")
    for flag, value in (("--max-new-tokens", args.max_new_tokens), ("--max-len", args.max_len),
                        ("--rounds-per-call", args.rounds_per_call), ("--prefill-chunk", args.prefill_chunk)):
        if value is not None and value < 1:
            parser().error(f"{flag} must be >= 1, got {value}")
    if problem := seed_problem(args.seed, "--seed"):
        parser().error(problem)
    if args.repeats is not None and args.repeats < 1:
        parser().error(f"--repeats must be >= 1, got {args.repeats}")
    if args.repeats is not None and not compare:
        parser().error("--repeats only applies to the demo's comparison (no --model, no --method)")
    args.repeats = args.repeats or REPEATS
    if args.method in ("dflash", "ddtree") and not args.draft:
        parser().error(f"--method {args.method} needs --draft DIR (a DFlash drafter checkpoint)")
    if args.method not in ("dflash", "ddtree") and \
            any(x is not None for x in (args.draft, args.block_size, args.draft_dtype)):
        parser().error("--draft/--block-size/--draft-dtype only apply to --method dflash or ddtree")
    if args.block_size is not None and args.block_size < 2:
        parser().error(f"--block-size must be >= 2 (the anchor and at least one drafted token), got "
                       f"{args.block_size}")
    for flag, attr, method in (("--budget", "budget", "ddtree"), ("--mtp-tokens", "mtp_tokens", "mtp")):
        # A count that belongs to one method: refused elsewhere, at least 1 (defaulted below).
        if getattr(args, attr) is not None and args.method != method:
            parser().error(f"{flag} only applies to --method {method}")
        if getattr(args, attr) is not None and getattr(args, attr) < 1:
            parser().error(f"{flag} must be >= 1, got {getattr(args, attr)}")

    if args.tp < 1 or args.dp < 1:
        parser().error(f"--tp and --dp must be >= 1, got {args.tp} and {args.dp}")
    if compare and args.tp * args.dp > 1:
        parser().error("the demo comparison runs on one device; pass --method with --tp/--dp")
    # A cache dir that a file keeps from being one: JAX only warned (FileExistsError) at each program it could not
    # keep, naming neither. Passed as --compile-cache: refused; the default place: said, and the run goes on without.
    if (cache := compile_cache_dir(args.compile_cache, os.environ)) and (blocker := blocking_file(cache)) is not None:
        if args.compile_cache is not None:
            where = "" if blocker == Path(cache).absolute() else f"{blocker} "
            parser().error(f"--compile-cache {args.compile_cache}: {where}is not a directory")
        print(f"[no compile cache: {blocker} is not a directory; pass --compile-cache DIR, or off]", file=sys.stderr)
        cache = ""

    from jaxspec import sharding
    sharding.claim_device_memory()      # before the first use of a device
    import jax
    from flax import nnx

    from jaxspec.config import ConfigError
    from jaxspec.engine import AR, PREFILL_CHUNK, Engine, context_problem
    from jaxspec.model import Qwen35
    from jaxspec.tokenizer import QWEN36_NAME, load_tokenizer

    if cache is not None:
        jax.config.update("jax_compilation_cache_dir", cache or None)
    if args.distributed:
        try:
            kw = distributed_args(os.environ)
        except ValueError as e:
            parser().error(f"--distributed: {e}")
        try:
            jax.distributed.initialize(**kw)          # before anything starts a backend
        except (ValueError, RuntimeError) as e:     # no coordinator found, or it did not answer
            parser().error(f"--distributed: {e} (set JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID, "
                           "or run under SLURM, Open MPI or Kubernetes)")
    budget_given = args.budget is not None
    if args.method == "ddtree" and args.budget is None:
        args.budget = default_budget(jax.default_backend())
    if args.method == "mtp" and args.mtp_tokens is None:
        args.mtp_tokens = MTP_TOKENS
    mesh = None
    if args.tp * args.dp > 1:
        try:
            mesh = sharding.make_mesh(args.tp, args.dp)
        except ConfigError as e:
            parser().error(str(e))
    t0 = time.perf_counter()
    if demo:
        args.model = str(demo_dir() / "target")
        print(f"NOTE: no --model given: running the small demo pair in {demo_dir()} (a Qwen3.6-architecture "
              "target trained on the Python standard library, and its DFlash drafter).", file=sys.stderr)
        if args.dtype is None:
            args.dtype = "float32"
    if args.model is None:
        print(f"NOTE: the demo pair is not installed ({demo_dir()} has no target/ and drafter/; "
              "`python -m jaxspec.train pair` makes it).", file=sys.stderr)
        print("NOTE: no --model given: running a tiny RANDOM-WEIGHT model (4 layers, width 64) with the real "
              "Qwen3.6 tokenizer. Its output is meaningless; pass --model DIR for a real checkpoint.",
              file=sys.stderr)
        cfg = tiny_random_config()
        if args.dtype:
            cfg = cfg.replace(dtype=args.dtype)
        model = Qwen35(cfg, rngs=nnx.Rngs(args.seed))
        if mesh is not None:
            try:
                model = sharding.shard_target(model, mesh)
            except ConfigError as e:
                parser().error(str(e))
    else:
        from convert.hf import CheckpointError
        from convert.store import load_model
        from jaxspec.config import ConfigError
        try:
            model = load_model(args.model, dtype=args.dtype, mesh=mesh)
        except (ConfigError, CheckpointError) as e:
            parser().error(f"--model {args.model}: {e}")
    try:
        tok = load_tokenizer(args.model)
        ids = tok.chat(args.prompt, not args.no_thinking) if args.chat else tok.encode(args.prompt)
    except Exception as e:      # transformers' errors vary by file and version; name the directory and the cause
        where = f"--model {args.model}" if args.model else "the Qwen3.6 tokenizer"
        parser().error(f"{where}: tokenizer: {e}" if isinstance(e, ValueError) and "--chat" in str(e)
                       else f"{where}: cannot load or apply its tokenizer: {type(e).__name__}: {e}")
    if not ids:
        parser().error("--prompt encodes to no tokens")
    if max(ids) >= model.cfg.vocab_size:
        why = (f" (--model {args.model} has no tokenizer files, so the Qwen3.6 vocabulary stood in: put the model's "
               "tokenizer.json (or vocab.json + merges.txt) there)" if args.model and tok.name == QWEN36_NAME else "")
        parser().error(f"tokenizer {tok.name} produced id {max(ids)} >= the model's vocab_size "
                       f"{model.cfg.vocab_size}{why}")
    stops = () if args.ignore_eos else tuple(set(model.cfg.eos_token_ids) | set(tok.eos_ids))
    speculator = None
    if args.method == "ddtree":     # before the drafter's load (GBs at 27B), not after
        from jaxspec.dflash import budget_problem
        if problem := budget_problem(args.budget, model.cfg.max_position_embeddings):
            parser().error(problem if budget_given else f"{problem} (this backend's default; pass a smaller --budget)")
    if args.method in ("dflash", "ddtree"):
        from convert.drafter import load_draft
        from convert.hf import CheckpointError
        from jaxspec.config import ConfigError
        from jaxspec.dflash import DFlash, default_draft_dtype
        from jaxspec.drafter_config import check_pair
        try:
            if args.draft_dtype is None:
                args.draft_dtype = default_draft_dtype(jax.default_backend(), model.cfg.dtype)
            drafter = load_draft(args.draft, dtype=args.draft_dtype)
            check_pair(drafter.cfg, model.cfg)          # a drafter for another target: --draft's error
            if mesh is not None:
                drafter = sharding.shard_drafter(drafter, mesh)
        except (ConfigError, CheckpointError) as e:
            parser().error(f"--draft {args.draft}: {e}")
        if args.block_size is None:
            args.block_size = default_block(jax.default_backend(), drafter.cfg.block_size)
        try:
            speculator = DFlash(drafter, model.cfg, args.block_size, budget=args.budget)
        except ConfigError as e:        # --block-size past the drafter's trained block: the message names the flag
            parser().error(str(e))
    if args.method == "mtp":
        from jaxspec.mtp import MTP, MTPHead
        if args.model is None:  # the random model gets a random head, so that the path runs out of the box
            head = MTPHead(cfg, rngs=nnx.Rngs((args.seed + 1 + 2**63) % 2**64 - 2**63))   # seed + 1, in int64
        else:
            from convert.hf import CheckpointError
            from convert.mtp import load_mtp
            from jaxspec.config import load_target_config
            try:
                # the checkpoint's own (unsharded) shapes; the head is then laid out like the target
                head = load_mtp(args.model, load_target_config(args.model, dtype=str(model.cfg.dtype)))
            except CheckpointError as e:
                where = f"the demo pair's target ({args.model}) has none; pass --model DIR" if demo else \
                    f"--model {args.model}"
                parser().error(f"--method mtp needs the checkpoint's MTP head: {where}: {e}")
        if mesh is not None:
            head = sharding.shard_mtp(head, mesh)
        speculator = MTP(head, model.cfg, args.mtp_tokens)
    if beyond := sorted(i for i in stops if not 0 <= i < model.cfg.vocab_size):
        parser().error(f"--model {args.model}: end-of-sequence ids {beyond} (from generation_config.json or the "
                       f"tokenizer {tok.name}) are outside the model's vocabulary [0, {model.cfg.vocab_size}); "
                       f"pass --ignore-eos to generate without stopping at them")
    if problem := context_problem(len(ids), args.max_new_tokens, args.max_len, (speculator or AR()).tree_size,
                                  model.cfg.max_position_embeddings, "--max-new-tokens", "--max-len"):
        parser().error(problem)     # before anything is printed
    if compare:
        return _compare(args, model, tok, ids, speculator, sampling, stops)
    try:
        engine = Engine(model, speculator, sampling=sampling, stop_tokens=stops, mesh=mesh,
                        prefill_chunk=args.prefill_chunk or PREFILL_CHUNK)
    except ValueError as e:
        parser().error(str(e))
    label = _label(args, args.method, model.cfg.dtype)
    print(f"[loaded in {time.perf_counter() - t0:.1f}s; method {label}; prompt {len(ids)} tokens]", file=sys.stderr)

    emitted: list[int] = []
    # Tokens before `line` are printed for good (up to a line's end); `printed` is the text of the tokens after it
    # written so far (None until the first tokens: the prompt goes out with them, so an error before leaves none).
    # Each segment decodes from `line` on, not the whole output: a long generation's prints stay short.
    line, printed = 0, None

    def show(chunks):
        nonlocal line, printed
        if printed is None:
            sys.stdout.write(args.prompt if not args.chat else "")
            printed = ""
        emitted.extend(chunks[0])
        text = tok.decode(readable(emitted[line:], stops))
        # Print only whole characters: a multi-byte character may span tokens.
        if not text.endswith("\ufffd"):
            sys.stdout.write(text[len(printed):])
            sys.stdout.flush()
            line, printed = (len(emitted), "") if text.endswith("\n") else (line, text)

    try:
        res = engine.generate([ids] * args.dp, args.max_new_tokens, max_len=args.max_len, seed=args.seed,
                              rounds_per_call=args.rounds_per_call or ROUNDS_PER_CALL, on_tokens=show)
    except (ValueError, jax.errors.JaxRuntimeError) as e:
        return _decode_error(e, args.method, midline=printed is not None)
    sys.stdout.write(tok.decode(readable(emitted[line:], stops))[len(printed):] + "\n")
    n, rate, rounds = _counts(res)
    each = f" per sequence (batch of {args.dp})" if args.dp > 1 else ""
    if not rounds:      # --max-new-tokens 1, or a stop token first
        print(f"[{tokens(n)}{each} from the prefill ({res.prefill_s:.2f}s); no decode rounds]", file=sys.stderr)
        return 0
    print(f"[{tokens(n)}{each}: prefill {res.prefill_s:.2f}s (the first token), decode {res.decode_s:.2f}s "
          f"({rate:.1f} tok/s{' per sequence' if each else ''} after the first, includes compilation); "
          f"tau {res.tau:.2f} tokens/round over {rounds} round{'s' * (rounds != 1)}]", file=sys.stderr)
    if args.method != "ar":
        hist = " ".join(f"{k}:{int(c)}" for k, c in enumerate(res.hist) if k and c)
        print(f"[acceptance histogram (tokens per round: rounds): {hist}]", file=sys.stderr)
    return 0


def _counts(r) -> tuple[str, float, int]:
    """A Result's tokens per sequence (a range where the rows differ), its decode tok/s per sequence (the tokens
    decoded in rounds: the prefill chooses each row's first) and its rounds (the most that any row ran)."""
    lens = [len(t) for t in r.tokens]
    n = str(lens[0]) if min(lens) == max(lens) else f"{min(lens)}-{max(lens)}"
    return n, (sum(lens) - len(lens)) / len(lens) / max(r.decode_s, 1e-9), int(r.rounds.max())


def tokens(n: str) -> str:
    """A count from _counts with its noun: "1 token", "5 tokens", "1-5 tokens"."""
    return f"{n} token" if n == "1" else f"{n} tokens"


def _decode_error(e, method: str = "ar", midline: bool = False) -> int:
    """Status 2 with one line for an error while decoding: a bad request (ValueError) or the device out of
    memory for the cache (--max-len) or the draft (DRAFT_FLAGS); any other runtime error is raised. `midline`:
    text is on stdout, so the line starts on a new one."""
    import jax
    from jaxspec.engine import NoRoom
    start = "\n" if midline else ""
    if isinstance(e, jax.errors.JaxRuntimeError):
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise e
        first = str(e).strip().splitlines()[0]
        draft = DRAFT_FLAGS.get(method, ())
        grow = f", and each round's draft and verify with {' and '.join(draft)}" if draft else ""
        lower = ("--max-len", "--max-new-tokens", *draft)
        print(f"{start}error: out of device memory ({first}); the KV cache and GDN state grow with --max-len, the "
              f"batch (--dp) and the dtype{grow}: lower {', '.join(lower[:-1])} or {lower[-1]}, or shard over "
              "more devices (--tp)", file=sys.stderr)
    elif isinstance(e, NoRoom):     # the engine names its own argument (max_len): say which flags size the cache
        print(f"{start}error: {e}; the cache grows with --max-len (by default what the prompt and --max-new-tokens "
              "need) and the batch (--dp): lower them, or shard over more devices (--tp)", file=sys.stderr)
    else:
        print(f"{start}error: {e}", file=sys.stderr)
    return 2


def same_tokens(same: bool, greedy: bool, dtype: str) -> str:
    """The demo's answer to "same tokens as AR?", with the reason where a difference is expected."""
    if same:
        return "yes"
    if not greedy:
        return "NO (sampled: speculation keeps AR's distribution, not its draws)"
    if dtype != "float32":
        return (f"NO (in {dtype} a many-token verify rounds near-tied tokens differently from a one-token step; "
                "token identity is checked in float32: --dtype float32)")
    return "NO"


def _label(args, method: str, target_dtype: str) -> str:
    """The method as the output names it; a drafter whose dtype is not the target's (--draft-dtype, or a GPU's
    bfloat16 default under a float32 target) is named too."""
    if method not in ("dflash", "ddtree"):
        return method
    label = (f"ddtree (budget {args.budget}, block {args.block_size})" if method == "ddtree"
             else f"dflash (block {args.block_size})")
    return label + (f" with a {args.draft_dtype} drafter" if args.draft_dtype != str(target_dtype) else "")


def _compare(args, model, tok, ids, speculator, sampling, stops) -> int:
    """The demo: AR and DDTree on the same prompt, each compiled first, then timed `--repeats` times in turn
    (AR, DDTree, AR, ...) so that both meet the same load on the host; the DDTree text, tau and the speedup
    of the median runs."""
    import jax

    from jaxspec.engine import PREFILL_CHUNK, Engine
    engines, timed = {}, {}
    kw = dict(max_len=args.max_len, seed=args.seed)
    if args.rounds_per_call:
        kw["rounds_per_call"] = args.rounds_per_call
    try:
        for name, spec in (("ar", None), (args.method, speculator)):
            engine = Engine(model, spec, sampling=sampling, stop_tokens=stops,
                            prefill_chunk=args.prefill_chunk or PREFILL_CHUNK)
            t = time.perf_counter()
            engine.generate([ids], args.max_new_tokens, **kw)              # compiles
            engines[name] = (engine, time.perf_counter() - t)
        for _ in range(args.repeats):
            for name, (engine, _) in engines.items():
                timed.setdefault(name, []).append(engine.generate([ids], args.max_new_tokens, **kw))
    except (ValueError, jax.errors.JaxRuntimeError) as e:
        return _decode_error(e, args.method)
    median = lambda rs: sorted(rs, key=lambda r: r.decode_s)[len(rs) // 2]
    runs = {name: (median(timed[name]), compile_s) for name, (_, compile_s) in engines.items()}
    of = f" (median of {args.repeats} runs)" if args.repeats > 1 else ""
    res, _ = runs[args.method]
    sys.stdout.write(args.prompt + tok.decode(readable(res.tokens[0], stops)) + "\n")
    for name, (r, compile_s) in runs.items():
        n, rate, rounds = _counts(r)
        label = _label(args, name, model.cfg.dtype)
        print(f"[{label}: {tokens(n)} in {r.decode_s:.3f}s{of} ({rate:.1f} tok/s after the first; compiled in "
              f"{compile_s:.1f}s before); tau {r.tau:.2f} tokens/round over {rounds} round{'s' * (rounds != 1)}]",
              file=sys.stderr)
    ar, sp = runs["ar"][0], res
    same = same_tokens(ar.tokens == sp.tokens, sampling.greedy, str(model.cfg.dtype))
    ar_rate, sp_rate = _counts(ar)[1], _counts(sp)[1]      # decoded tokens per second: either may stop early
    speedup = f"{sp_rate / ar_rate:.2f}x" if ar_rate else "n/a (AR decoded no token after the first)"
    print(f"[{args.method} speedup over AR: {speedup}; tau {sp.tau:.2f}; same tokens as AR: {same}]",
          file=sys.stderr)
    hist = " ".join(f"{k}:{int(c)}" for k, c in enumerate(sp.hist) if k and c)
    print(f"[acceptance histogram (tokens per round: rounds): {hist}]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
