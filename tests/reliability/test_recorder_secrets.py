"""No planted secret reaches the bytes of a trace file (issue 12, item 9).

Generated secrets of every kind (API-key shapes, URL credentials, Basic auth,
values of environment variables whose names no list knows, secrets holding
quotes, backslashes and tabs, literal ``redact_patterns``) are planted in
every place a string lands: span names, sample ids, inputs, outputs,
attributes, errors, tracebacks, mapping keys, the config. The files are read
back with pyarrow (every string of every column, the schema and batch
metadata) and their raw bytes are searched. Figures: secrets planted, found.
"""

from __future__ import annotations

import glob
import os
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_fixtures import FIGURES

import tracer

pytestmark = pytest.mark.usefixtures("figures_report")

SETTINGS = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
TALLY = {"runs": 0, "secrets planted": 0, "secrets found on disk": 0}

ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


@st.composite
def _with_each(draw: st.DrawFn, alphabet: str, size: tuple[int, int], pools: tuple[str, ...]) -> str:
    """A text of ``alphabet`` holding a character of every one of ``pools``: built so, not filtered (no health check trips)."""
    chars = list(draw(st.text(alphabet=alphabet, min_size=size[0] - len(pools), max_size=size[1] - len(pools))))
    for pool in pools:
        chars.insert(draw(st.integers(0, len(chars))), draw(st.sampled_from(pool)))
    return "".join(chars)


body = _with_each(ALNUM, (24, 40), (ALNUM[:26], ALNUM[26:52], ALNUM[52:]))  # a lower, an upper, a digit
odd = _with_each(ALNUM + "\"\\\t'", (12, 24), ('"\\\t',))  # a quote, backslash or tab

#: (kind, the secret, the text it is planted in).
secrets = st.one_of(
    body.map(lambda b: ("openai", f"sk-{b}", f"sk-{b}")),
    body.map(lambda b: ("anthropic", f"sk-ant-{b}", f"key sk-ant-{b} here")),
    body.map(lambda b: ("hf", f"hf_{b}", f"hf_{b}")),
    body.map(lambda b: ("url userinfo", f"P{b}", f"https://bob:P{b}@example.com/x")),
    body.map(lambda b: ("url query", f"Q{b}", f"https://example.com/v1?api_key=Q{b}&page=2")),
    body.map(lambda b: ("basic auth", f"{b}==", f"Authorization: Basic {b}==")),
    body.map(lambda b: ("bearer", f"{b}", f"Bearer {b}")),
)
#: A generated credential: 32 characters drawn at random (not shrunk to "000...Aa": a value
#: under a name no list knows is told from configuration only by looking generated).
generated = st.randoms(use_true_random=True).map(lambda r: "".join(r.choice(ALNUM) for _ in range(32)))
#: (env name, value): names no list holds with generated values; secret-sounding names with quotes/backslashes/tabs.
env_secrets = st.one_of(
    st.tuples(st.sampled_from(["XQ_ZED", "MYAPP_VALUE", "SVC_ID_9", "ACME_SIGNING"]), generated),
    st.tuples(st.sampled_from(["DB_PASS", "APP_PWD", "SESSION_COOKIE", "LEGACY_AUTH"]), odd),
)
key_names = st.sampled_from(
    ["aws_secret_access_key", "SecretAccessKey", "Cookie", "set-cookie", "AccountKey", "x-api-key", "client_secret"]
)


def _all_strings(path: str) -> tuple[list[str], bytes]:
    with open(path, "rb") as f:
        raw = f.read()
    out: list[str] = []
    # A closed shard may be an IPC file: its messages are a stream after the 8-byte magic.
    reader = pa.ipc.open_stream(raw[8:] if raw.startswith(b"ARROW1") else raw)
    for meta in (reader.schema.metadata or {}).items():
        out.extend(x.decode("utf-8", "replace") for x in meta)
    while True:
        try:
            batch, custom = reader.read_next_batch_with_custom_metadata()
        except StopIteration:
            break
        for meta in (custom or {}).items() if custom else []:
            out.extend(x.decode("utf-8", "replace") for x in meta)
        for col in batch.columns:
            out.extend(v for v in col.to_pylist() if isinstance(v, str))
    return out, raw


@SETTINGS
@given(planted=secrets, env=env_secrets, key=key_names, literal=body)
def test_no_planted_secret_reaches_the_files(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    planted: tuple[str, str, str],
    env: tuple[str, str],
    key: str,
    literal: str,
) -> None:
    """Secrets planted in names, ids, inputs, outputs, attributes, errors, keys and config: none is on disk."""
    _, secret, text = planted
    env_name, env_value = env
    monkeypatch.setenv(env_name, env_value)
    literal = "LIT" + literal
    out = str(tmp_path_factory.mktemp("s"))
    cfg = tracer.init(
        output_dir=out,
        flush_interval_s=60.0,
        redact_patterns=[literal],
        backend_options={"arrow": {"note": text, "endpoint": f"https://u:{env_value}@h/"}},
    )

    @tracer.rollout_trace_op(name=f"call {text}")
    def call(prompt: Any, **kw: Any) -> Any:
        return {"echo": prompt, "env": env_value, "lit": literal}

    @tracer.rollout_trace_op(name="fails")
    def fails(x: Any) -> None:
        raise RuntimeError(f"boom {text} {env_value} {literal} {x}")

    with tracer.rollout_trace_attr(sample_index=f"id-{text}", step=1, note=text, **{key: "plainvalue123456"}):
        call(f"please use {text} and {env_value}", headers={key: "plainvalue123456"}, other=literal)
        try:
            fails(text)
        except RuntimeError:
            pass
        tracer.log_reward(1.0, info=f"{text} {env_value}")
    assert tracer.flush().ok
    tracer.shutdown()
    planted_values = [secret, env_value, literal, "plainvalue123456"]
    found = 0
    files = glob.glob(os.path.join(cfg.run_dir, "*.arrow"))
    assert files
    for path in files:
        strings, raw = _all_strings(path)
        for value in planted_values:
            hits = [s for s in strings if value in s] + ([b"raw"] if value.encode() in raw else [])
            found += len(hits)
            assert not hits, (value, hits[:3])
    TALLY["runs"] += 1
    TALLY["secrets planted"] += len(planted_values)
    TALLY["secrets found on disk"] += found
    FIGURES["secrets on disk"] = dict(TALLY)
