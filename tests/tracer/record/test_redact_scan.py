"""The secret scan's fast trigger search decides exactly as a search for every trigger would."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tracer.record.redact import FOLDED_TRIGGERS, MAX_ANCHOR_HITS, REDACTED, Redactor, TriggerScan
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


@settings(max_examples=600, deadline=None)
@given(parts=st.lists(_SECRET_PIECES, max_size=12))
def test_every_text_a_pattern_would_change_is_scanned_and_redacted(parts: list[str]) -> None:
    """Property: the trigger gate never skips a text the redaction patterns would change (any letter case)."""
    text = "".join(parts)
    redactor = Redactor(environ={})
    ungated = redactor.text_ungated(text)
    if ungated != text:
        assert redactor.records_to_scan([[text]], set()) == [True]
        assert redactor.text(text) == ungated


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
