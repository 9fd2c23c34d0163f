"""Loading a tokenizer named by path, for token2text."""

from __future__ import annotations

import os
from typing import Any


def load_tokenizer(path: str) -> Any:
    """Load a Hugging Face tokenizer from a folder or a ``tokenizer.json``.

    Uses the light ``tokenizers`` package when a ``tokenizer.json`` is there,
    else ``transformers.AutoTokenizer`` (local files only: never a hub).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ImportError: neither package is installed; names the pip line.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"tokenizer path {path!r} does not exist; give a folder with tokenizer.json or a tokenizer.json file"
        )
    file = path if os.path.isfile(path) else os.path.join(path, "tokenizer.json")
    if os.path.isfile(file):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            pass
        else:
            return Tokenizer.from_file(file)
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ImportError(
            f"token2text needs a tokenizer library to load {path!r}: pip install 'rollout-trace[tokenizers]'"
        ) from exc
    return AutoTokenizer.from_pretrained(path, local_files_only=True)
