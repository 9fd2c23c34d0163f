"""The secret scan's fast trigger search decides exactly as a search for every trigger would."""

from __future__ import annotations

import re
import string

from hypothesis import given, settings
from hypothesis import strategies as st

from tracer.record.redact import (
    FOLDED_TRIGGERS,
    GATE_MIN_CHARS,
    MAX_ANCHOR_HITS,
    REDACTED,
    SECRET_KEY_ENDINGS,
    URL_USERINFO,
    Redactor,
    TriggerScan,
    _search_all,
    _url_userinfo,
    is_secret_key,
)
from tracer.record.redact import TRIGGERS as EXACT

#: Both trigger sets: the scan is the same for each (the folded ones search the lower-cased text); and
#: triggers anchored on ``_`` and ``:``, which the redactor gates otherwise, so that the
#: scan's split search stays held to its promise for the anchors common in code and JSON.
TRIGGERS = (*EXACT, *FOLDED_TRIGGERS, "hf_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "://")
SCAN = TriggerScan(TRIGGERS)
#: Text made of pieces of triggers, their characters and filler: near-misses are common.
PIECES = st.one_of(
    st.sampled_from(TRIGGERS),
    st.sampled_from(TRIGGERS).map(lambda t: t[1:]),
    st.sampled_from(TRIGGERS).map(lambda t: t[:-1]),
    st.sampled_from(sorted(set("".join(TRIGGERS)))),
    st.text(max_size=5),
)

#: The non-alphanumeric characters of the triggers: the common anchors the scan splits its search at.
ANCHORS = st.sampled_from(sorted({c for t in TRIGGERS for c in t if not c.isalnum()}))


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(PIECES, max_size=30))
def test_found_agrees_with_searching_every_trigger(parts: list[str]) -> None:
    """Property: for any text, found() is any(trigger in text)."""
    text = "".join(parts)
    assert SCAN.found(text) == any(t in text for t in TRIGGERS)


@given(trigger=st.sampled_from(TRIGGERS), filler=st.sampled_from(["_", ":", "=", "-", "K"]))
def test_a_trigger_after_many_common_anchor_characters_is_found(trigger: str, filler: str) -> None:
    """A trigger past more than MAX_ANCHOR_HITS occurrences of its anchor character is still found."""
    text = (filler + " ") * (MAX_ANCHOR_HITS + 10) + trigger
    assert SCAN.found(text)


def test_secret_values_of_any_characters_are_found() -> None:
    """Values with no rankable character (digits, non-ASCII) and long ones are searched for whole."""
    values = ["12345678901234", "пароль-секрет", "x" * 100]
    scan = TriggerScan(values)
    for v in values:
        assert scan.found(f"a {v} b") and not scan.found(f"a {v[:-1]} b")


@settings(max_examples=300, deadline=None)
@given(anchor=ANCHORS, parts=st.lists(PIECES, max_size=30), lead=st.text(max_size=4))
def test_the_split_scan_of_a_common_anchor_agrees_with_searching_every_trigger(
    anchor: str, parts: list[str], lead: str
) -> None:
    """Property: past MAX_ANCHOR_HITS of one anchor character, found() is still any(trigger in text)."""
    text = lead + (anchor + " ") * (MAX_ANCHOR_HITS + 1) + "".join(parts)
    assert SCAN.found(text) == any(t in text for t in TRIGGERS)


#: Pieces of credentials in any letter case, their separators, and characters whose case folds oddly.
_SECRET_PIECES = st.one_of(
    st.sampled_from(
        [
            "bearer ",
            "basic ",
            "api_key=",
            "apikey=",
            "token=",
            "secret=",
            "passwd=",
            "pwd=",
            "sig=",
            "auth=",
            "credential=",
            "password=",
            "signature=",
            '"api_key": "',
            "'db_pass': '",
            '\\"secrets\\": ',
            "Auth=(",
            "X-Api-Key: ",
            "session_id :",
            "ACCESS_KEY_ID =",
            "sk-",
            "sk-proj-",
            "hf_",
            "ghp_",
            "ghs_",
            "AKIA",
            "https://",
            "user:pw@host",
            "abcdefghijklmnop1234",
            "ABCDEFGHIJKLMNOPQRST",
            "dXNlcjpwYXNzd29yZA==",
            "0123456789",
        ]
    ).flatmap(
        lambda w: st.lists(st.booleans(), min_size=len(w), max_size=len(w)).map(
            lambda flips: "".join(c.swapcase() if f else c for c, f in zip(w, flips))
        )
    ),
    st.sampled_from(
        [" ", "\t", "\n", "=", "&", ":", "/", "@", "-", "_", '"', "'", "\\", "(", ")", "ſ", "K", "İ", "ı", "é"]
    ),
    st.text(max_size=3),
)


#: Prose with no secret, long enough that a chunk holding it is searched by the RE2 gate.
PADDING = "The reply explains each step and the reward it earned. " * (GATE_MIN_CHARS // 50)


@settings(max_examples=600, deadline=None)
@given(parts=st.lists(_SECRET_PIECES, max_size=12), value=st.sampled_from(["", "Zq9-vXw2+kk/8é\\x", "12345678"]))
def test_every_text_a_pattern_would_change_is_scanned_and_redacted(parts: list[str], value: str) -> None:
    """Property: neither gate (Python's triggers, RE2's pattern) skips a text the rules would change."""
    text = "".join(parts)
    redactor = Redactor(environ={"MY_TOKEN": value} if value else {})
    if value and len(parts) % 2:
        text += value
    ungated = redactor.text_ungated(text)
    if ungated != text:
        assert redactor.records_to_scan([[text]], set()) == [True]
        assert redactor.text(text) == ungated
        assert _search_all(redactor.gate, [text]) == [True]
        assert redactor.records_to_scan([[PADDING], [PADDING, text]], set()) == [False, True]
        assert redactor.records_to_scan([["plain", "words"], ["x", text]], set()) == [False, True]


def test_a_chunk_of_long_plain_records_is_not_scanned() -> None:
    """Code and prose whose ``key=`` names no secret pass the RE2 gate of a long chunk unscanned."""
    redactor = Redactor(environ={})
    code = 'def f(key: str, ids_key="a", token_ids=None):\n    key = groups[key]\n    TURN_KEY = "x"\n' * 200
    assert redactor.records_to_scan([[PADDING], [code]], set()) is None
    assert redactor.records_to_scan([[PADDING], [code], ["prompt", "api_key=abc123xyz"]], {0}) == [True, False, True]


_SEPARATORS = st.lists(st.sampled_from(["", "", "", "_", "-", ".", "__"]), min_size=16, max_size=16)


@settings(max_examples=400, deadline=None)
@given(
    prefix=st.text(alphabet=string.ascii_letters + string.digits + "_-.", max_size=6),
    ending=st.sampled_from(SECRET_KEY_ENDINGS),
    seps=_SEPARATORS,
    flips=st.lists(st.booleans(), min_size=16, max_size=16),
    form=st.sampled_from(["{k}=v", '"{k}": "v"', "{k}: v", "{k} = v", "\\'{k}\\': 'v'"]),
)
def test_the_gate_matches_every_secret_key_spelling(
    prefix: str, ending: str, seps: list[str], flips: list[bool], form: str
) -> None:
    """Property: a secret key's value the rules redact, separators anywhere in the key, any case, passes the gate."""
    spelled = "".join(c.swapcase() if f else c for c, f in zip(ending, flips))
    key = prefix + "".join(c + s for c, s in zip(spelled[:-1], seps)) + spelled[-1]
    text = form.format(k=key)
    redactor = Redactor(environ={})
    if redactor.text_ungated(text) != text:
        assert is_secret_key(key)
        assert _search_all(redactor.gate, [text]) == [True], key


#: The URL rule as one regular expression: a scheme, then ``user:password`` before ``@``.
_URL_REFERENCE = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)[^\s/@:\"'<>]*:[^\s/@\"'<>]+(?=@)")


@settings(max_examples=400, deadline=None)
@given(
    parts=st.lists(st.sampled_from(["://", "@", ":", "/", "a", "Z", "1", "+", "-", " ", "pw", "'", "é"]), max_size=16)
)
def test_url_credentials_are_redacted_as_the_reference_rule_does(parts: list[str]) -> None:
    """Property: the ``://``-anchored URL rule changes a text exactly as the whole-URL regular expression does."""
    text = "".join(parts)
    assert URL_USERINFO.sub(_url_userinfo, text) == _URL_REFERENCE.sub(lambda m: m.group(1) + REDACTED, text)


def test_mixed_case_headers_and_parameters_are_redacted() -> None:
    """The spellings the pre-scan once once let through unscanned are redacted."""
    redactor = Redactor(environ={})
    for text, kept in (
        ("Authorization: BeArEr abcdefghijklmnop1234", "Authorization: "),
        ("Authorization: BaSiC dXNlcjpwYXNzd29yZA==", "Authorization: "),
        ("https://x.org/?aPi_KeY=s3cr3tv4lu3", "https://x.org/?aPi_KeY="),
        ("tOkEn=abc123", "tOkEn="),
    ):
        assert redactor.records_to_scan([[text]], set()) == [True], text
        assert redactor.text(text) == kept + REDACTED, text


def test_underscores_and_urls_without_a_credential_skip_the_patterns() -> None:
    """Code and links (underscores, ``://``) without ``@`` or a long token tail are not searched; credentials are."""
    redactor = Redactor(environ={})
    plain = 'see https://example.org/a_b and <tool_call>{"name": "run_python", "code": "x_1 = a_b"}' * 20
    assert redactor.records_to_scan([[plain]], set()) is None
    for secret in (
        "hf_" + "a1" * 10,
        "ghp_" + "B2" * 15,
        "git clone https://user:pw@host/repo",
    ):
        assert redactor.records_to_scan([[plain, secret]], set()) == [True], secret
        assert REDACTED in redactor.text(plain + secret), secret


_JSON_SCALARS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.booleans(),
    st.none(),
    st.just("api_key=Zq9vXw2kk8"),
    st.just("plain"),
)


@settings(max_examples=300, deadline=None)
@given(data=st.lists(st.one_of(_JSON_SCALARS, st.lists(_JSON_SCALARS, max_size=4)), max_size=12))
def test_value_redacts_every_string_in_lists_and_keeps_lists_of_numbers(data: list[object]) -> None:
    """Property: Redactor.value leaves no secret in a list of any JSON values; a list of numbers comes back as is."""
    redactor = Redactor(environ={})
    clean = redactor.value(data)
    assert "Zq9vXw2kk8" not in repr(clean)
    if all(type(v) in (int, float, bool) for v in data):
        assert clean is data


def test_records_pyarrow_refuses_are_decided_in_python() -> None:
    """A chunk holding text pyarrow cannot take (a lone surrogate) is still scanned record by record."""
    redactor = Redactor(environ={})
    assert redactor.records_to_scan([[PADDING], ["\ud800 api_key=abc123xyz"]], set()) == [False, True]
    assert redactor.records_to_scan([[PADDING], ["\ud800 plain"]], set()) is None
