"""Loading a tokenizer named by path, and checking that a tokenizer decodes, for token2text."""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any

from tracer.extras import install_command
from tracer.record.pieces import batch_decode

#: Tokenizers kept loaded, most recent last (an 18 MB tokenizer.json is ~100 MB in memory).
LOADED_TOKENIZERS_KEPT = 2


def load_tokenizer(path: str) -> Any:
    """Load a Hugging Face tokenizer from a folder or a ``tokenizer.json`` (local files only; cached while unchanged)
    with ``tokenizers``, else ``transformers.AutoTokenizer``. Raises FileNotFoundError, ImportError naming the pip line,
    or whatever the library raises."""
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"tokenizer path {path!r} does not exist; give a folder with tokenizer.json or a tokenizer.json file"
        )
    file = path if os.path.isfile(path) else os.path.join(path, "tokenizer.json")
    read = file if os.path.isfile(file) else path
    st = os.stat(read)
    return _load(path, file, (os.path.realpath(read), st.st_mtime_ns, st.st_size))


def check_decodes(tokenizer: Any, loaded_from_path: bool) -> None:
    """Decode ``[0]`` (a tokenizer loaded from a path) or ``[]`` the way the writer will; raises what it raised, or
    TypeError when it returned something other than one string."""
    out = batch_decode(tokenizer, [[0] if loaded_from_path else []])
    if len(out) != 1 or not isinstance(out[0], str):
        raise TypeError(f"decoding one sequence returned {out!r}, not one string")


def has_decode(tokenizer: Any) -> bool:
    """True when ``tokenizer`` has one of the decode methods token2text calls."""
    return any(callable(getattr(tokenizer, name, None)) for name in ("batch_decode", "decode_batch", "decode"))


@functools.lru_cache(maxsize=LOADED_TOKENIZERS_KEPT)
def _load(path: str, file: str, version: tuple[str, int, int]) -> Any:
    """The tokenizer at ``path``, cached per ``version`` of its file (real path, mtime, size)."""
    if os.path.isfile(file):
        with contextlib.suppress(ImportError):
            from tokenizers import Tokenizer

            return Tokenizer.from_file(file)
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ImportError(
            f"token2text needs a tokenizer library to load {path!r}: "
            f"{install_command('tokenizers' if os.path.isfile(file) else 'hf')}"
        ) from exc
    return AutoTokenizer.from_pretrained(path, local_files_only=True)
