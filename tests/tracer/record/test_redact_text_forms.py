"""A secret written as text under a secret-named key never reaches the files or an exporter's payload.

The forms: JSON (an OpenAI tool call's ``arguments``, JSON nested in a JSON
string twice), Python reprs, an exception's message, headers, URLs, command
lines and YAML lines, anywhere in a larger text. Text with no secret passes
unchanged.
"""

from __future__ import annotations

import json
import string
import tempfile
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import tracer
from tracer.record.redact import GATE_MIN_CHARS, REDACTED, Redactor, is_secret_key

#: The last word of a secret-named key, and what may come before it.
SECRET_WORDS = (
    "api_key",
    "apikey",
    "token",
    "access_token",
    "auth",
    "secret",
    "secrets",
    "pass",
    "password",
    "passwords",
    "passwd",
    "pwd",
    "authorization",
    "credentials",
    "cookie",
    "session_id",
    "private_key",
    "client_secret",
    "secret_access_key",
    "signature",
)
PREFIXES = ("", "my_", "openai-", "db.", "x-", "X_")


def _spell(word: str, case: int) -> str:
    return (word, word.upper(), word.title().replace("_", ""), word.replace("_", "-"))[case]


SECRET_KEYS = st.builds(
    lambda prefix, word, case: prefix + _spell(word, case),
    st.sampled_from(PREFIXES),
    st.sampled_from(SECRET_WORDS),
    st.integers(0, 3),
)
#: Credential characters: what API keys, tokens and passwords are made of.
#: Each holds a letter past ``f``, so that it cannot be part of a span id by chance.
SECRET_VALUES = st.text(
    alphabet=string.ascii_letters + string.digits + "-_.~+/!@$%^*", min_size=10, max_size=40
).filter(lambda s: any(c.isalpha() and c.lower() > "f" for c in s))
FILLER = st.text(alphabet=string.ascii_letters + " \n.", max_size=30)


def _tool_call(key: str, secret: str) -> object:
    arguments = json.dumps({key: secret, "query": "weather"})
    return {
        "role": "assistant",
        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": arguments}}],
    }


#: Each form: (key, secret) -> what a traced function takes, returns or raises.
FORMS: dict[str, Callable[[str, str], object]] = {
    "tool call arguments": _tool_call,
    "json in json": lambda k, s: json.dumps({"payload": json.dumps({"config": json.dumps({k: s, "n": 1})})}),
    "json tool result": lambda k, s: json.dumps({"ok": True, "data": {k: s}}),
    "dict repr": lambda k, s: repr({k: s, "user": "bob"}),
    "object repr": lambda k, s: f"Client({k}={s!r}, base_url='https://api.example.org')",
    "auth tuple": lambda k, s: repr({k: ("alice", s)}),
    "auth list json": lambda k, s: json.dumps({k: ["alice", s]}),
    "header": lambda k, s: f"POST /v1 HTTP/1.1\r\n{k}: {s}\r\nHost: example.org",
    "url": lambda k, s: f"https://api.example.org/v1?model=m&{k}={s}&stream=1",
    "command line": lambda k, s: f"run.py --{k}={s} --steps 3",
    "yaml": lambda k, s: f"model: m\n{k}: '{s}'\nsteps: 3",
    "log line": lambda k, s: f"connecting as bob {k}={s} retries=3",
}
#: Bare words that name a secret as a mapping key but are ordinary prose before ``:``
#: (``each token: ...``): the header and YAML forms spell them as a header would (``X-Token``).
PROSE_WORDS = {"token", "signature"}


def _key_for(form: str, key: str) -> str:
    if form in ("header", "yaml") and key.lower() in PROSE_WORDS:
        return "X-" + key
    return key


#: Prose with no secret, long enough that a chunk holding it is searched by the RE2 gate.
LONG_PROSE = "Each step of the rollout is scored, and the group shares one prompt. " * (GATE_MIN_CHARS // 60)

PLANTED = st.lists(
    st.tuples(st.sampled_from(sorted(FORMS)), SECRET_KEYS, SECRET_VALUES, FILLER, FILLER),
    min_size=1,
    max_size=6,
)


def _planted(items: list[tuple[str, str, str, str, str]]) -> list[tuple[object, str]]:
    out = []
    for form, key, secret, before, after in items:
        key = _key_for(form, key)
        assume(secret not in before + after)
        assert is_secret_key(key), key
        made = FORMS[form](key, secret)
        out.append((f"{before}{made}{after}" if isinstance(made, str) else made, secret))
    return out


def _everything(trace_dir: str) -> str:
    rows = tracer.read_spans(trace_dir).to_pylist()
    meta = [tracer.read_file_metadata(f) for f in tracer.list_trace_files(trace_dir)]
    return "\n".join(str(v) for row in rows for v in row.values()) + repr(meta)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=PLANTED)
def test_secrets_written_as_text_never_reach_the_files(items: list[tuple[str, str, str, str, str]]) -> None:
    """Property: a secret under any secret-named key, in any text form and position, is not in the files."""
    planted = _planted(items)
    secrets = [s for _, s in planted]
    trace_dir = tempfile.mkdtemp()
    tracer.init(output_dir=trace_dir)

    @tracer.rollout_trace_op(kind="tool")
    def tool(request: object) -> object:
        return request

    @tracer.rollout_trace_op(kind="tool")
    def failing(request: object) -> None:
        raise ValueError(f"bad request {request!r}")

    tool(LONG_PROSE)  # a chunk this long is searched by the RE2 gate first
    for value, _ in planted:
        tool(value)
        tool({"nested": [value]})
        with pytest.raises(ValueError):
            failing(value)
    assert tracer.shutdown().ok
    stored = _everything(trace_dir)
    assert REDACTED in stored
    for secret in secrets:
        assert secret not in stored, secret


@settings(max_examples=200, deadline=None)
@given(items=PLANTED)
def test_secrets_written_as_text_never_reach_an_exporters_payload(items: list[tuple[str, str, str, str, str]]) -> None:
    """Property: Redactor.value over a payload (span JSON held as text, attributes) leaves no planted secret."""
    redactor = Redactor(environ={})
    for value, secret in _planted(items):
        payload = {
            "spans": [
                {"name": "tool", "inputs": json.dumps({"request": value}), "attributes": {"raw": value}},
                {"error": json.dumps({"message": f"bad request {value!r}"})},
            ]
        }
        assert secret not in json.dumps(redactor.value(payload)), (value, secret)
        assert secret not in redactor.text(json.dumps(payload)), (value, secret)


@settings(max_examples=300, deadline=None)
@given(items=PLANTED)
def test_every_planted_secret_passes_the_gate_of_a_long_chunk(items: list[tuple[str, str, str, str, str]]) -> None:
    """Property: in a chunk long enough for the RE2 gate, exactly the records with a planted secret are scanned."""
    redactor = Redactor(environ={})
    for value, _ in _planted(items):
        text = value if isinstance(value, str) else json.dumps(value)
        assert redactor.records_to_scan([[LONG_PROSE], ["request", text]], set()) == [False, True], text


#: Keys that are no secret, some close to one (``monkey``, ``bypass``, ``tokenizer``, ``max_tokens``).
PLAIN_KEYS = st.sampled_from(
    ["model", "user", "name", "max_tokens", "prompt_token_ids", "tokenizer", "monkey", "bypass", "author", "id", "url"]
)
PLAIN_VALUES = st.text(alphabet=string.ascii_letters + string.digits + " -_.", max_size=30)


@settings(max_examples=300, deadline=None)
@given(form=st.sampled_from(sorted(FORMS)), key=PLAIN_KEYS, value=PLAIN_VALUES, before=FILLER, after=FILLER)
def test_text_with_no_secret_passes_unchanged(form: str, key: str, value: str, before: str, after: str) -> None:
    """Property: the same forms with keys that name no secret, and prose, are left exactly as they are."""
    redactor = Redactor(environ={})
    made = FORMS[form](key, value)
    text = f"{before}{made}{after}" if isinstance(made, str) else json.dumps(made)
    assert redactor.text(text) == text
    assert redactor.value({"v": made}) == {"v": made if isinstance(made, str) else json.loads(json.dumps(made))}


@pytest.mark.parametrize(
    "text",
    [
        "each token: one piece of the reply; the signature: def f(x) -> int",
        "the password was not required, and api_key=None was passed",
        '{"max_tokens": 512, "tokenizer": "qwen", "prompt_token_ids": [1, 2]}',
        "if password == expected: return",
    ],
)
def test_prose_and_code_without_a_secret_pass_unchanged(text: str) -> None:
    """Words that name secrets, in prose, comparisons and empty values, are no secret to hide."""
    assert Redactor(environ={}).text(text) == text


@pytest.mark.parametrize("key", ["auth", "secrets", "pass", "passwords", "DB_PASS", "dbPass", "http_auth"])
def test_short_secret_key_names_are_secret(key: str) -> None:
    """``auth`` (``auth=(user, password)``), ``secrets``, ``pass`` and ``passwords`` name secrets."""
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["bypass", "compass", "author", "max_tokens", "tokenizer", "monkey"])
def test_words_ending_like_a_secret_key_are_not(key: str) -> None:
    """Keys that only end in the letters of a secret word are kept."""
    assert not is_secret_key(key)


def test_a_foreign_span_column_is_redacted() -> None:
    """Redactor.texts: a foreign trace's key and Authorization header leave every string; non-strings pass."""
    inputs = json.dumps(
        {
            "headers": {"Authorization": "Bearer abcdefghijklmnop1234"},
            "client": "OpenAI(api_key='k3y-Zq9vXw2')",
            "arguments": json.dumps({"password": "hunter2-secret"}),
        }
    )
    redactor = Redactor(environ={})
    clean = redactor.texts(["call sk-AAAABBBBCCCCDDDDEEEE1234", inputs, 1, None])
    text = json.dumps(clean)
    for secret in ("abcdefghijklmnop1234", "k3y-Zq9vXw2", "hunter2-secret", "sk-AAAABBBB"):
        assert secret not in text, secret
    assert clean[2:] == [1, None]
    plain = ["generate", '{"model": "m"}']
    assert redactor.texts(plain) is plain
