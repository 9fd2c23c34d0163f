"""Secret redaction on the writer thread, by one :class:`Redactor` shared by recorder, importers and exporters.

Three rules replace with ``"<redacted>"``: the value of a mapping key naming a secret; the same keys written
with a value inside any text (:func:`redact_key_values`); credential shapes, secret environment values and the
config's extra patterns, anywhere. A text holding none of the triggers is not searched further, and a chunk's
records are gated first by RE2 searches of them all at once (:func:`gate_patterns`).
"""

from __future__ import annotations

import bisect
import collections
import functools
import itertools
import math
import os
import re
import string
from collections.abc import Callable, Iterable
from typing import Any

REDACTED = "<redacted>"

#: Endings of a mapping key (lower-cased, ``_``/``-``/``.``/spaces removed) that name a secret.
SECRET_KEY_ENDINGS = (
    "apikey", "token", "secret", "secretkey", "password", "passwd", "passphrase", "pwd", "authorization",
    "credential", "credentials", "privatekey", "accesskey", "accesskeyid", "accountkey", "masterkey", "signingkey",
    "encryptionkey", "clientkey", "cookie", "cookies", "sessionid", "sessionkey", "connectionstring", "sastoken",
    "sig", "signature", "auth", "secrets", "passwords"
)  # fmt: skip
_KEY_STRIP = re.compile(r"[\s_.\-]+")
_KEY_ENDING = re.compile("(?:" + "|".join(SECRET_KEY_ENDINGS) + ")$")

#: A key matching this is a secret (one of the rules of :func:`is_secret_key`).
SECRET_KEY_PATTERN = re.compile(
    r"(?i)^(.*[_-])?(api[_-]?key|apikey|token|access[_-]?token|secret|secret[_-]?key|password|passwd|"
    r"authorization|auth[_-]?token|private[_-]?key|credentials?)$"
)

#: Credential shapes found inside any string (the whole match is replaced).
SECRET_VALUE_PATTERNS = (
    r"sk-(?:proj-|ant-)?[A-Za-z0-9_\-]{16,}",  # OpenAI / Anthropic-style keys
    r"hf_[A-Za-z0-9]{20,}",  # Hugging Face tokens
    r"gh[pousr]_[A-Za-z0-9]{30,}",  # GitHub tokens
    r"AKIA[0-9A-Z]{16}",  # AWS access key ids
    r"(?ai:bearer)\s+[A-Za-z0-9._~+/\-]{12,}=*",  # Authorization: Bearer ... (any ASCII letter case)
    r"(?ai:basic)\s+[A-Za-z0-9+/]{8,}={0,2}",  # Authorization: Basic base64(user:password)
)

#: The ``user:password`` of ``scheme://user:password@host`` (replaced where a scheme precedes it).
_USERINFO = r"[^\s/@:\"'<>]*:[^\s/@\"'<>]+"
URL_USERINFO = re.compile(f"://({_USERINFO})(?=@)")
#: Characters of a URL scheme (one letter, then any of these).
_SCHEME_CHARS = frozenset(string.ascii_letters + string.digits + "+.-")

#: How every key name :func:`is_secret_key` accepts ends (lower-cased), by the word it starts with: a key and
#: its value is that word, the rest of the ending, a closing quote (escaped or not), a space or none, ``:``/``=``.
KEY_TAILS = {
    "key": ("key", "keyid", "key_id", "key-id"),
    "token": ("token",),
    "secret": ("secret", "secrets"),
    "pass": ("pass", "password", "passwords", "passwd", "passphrase"),
    "pwd": ("pwd",),
    "auth": ("auth", "authorization"),
    "credential": ("credential", "credentials"),
    "cookie": ("cookie", "cookies"),
    "sig": ("sig", "signature"),
    "session": ("sessionid", "session_id", "session-id"),
    "connection": ("connectionstring", "connection_string"),
}
_KEY_VALUE = {
    word: re.compile(
        r"(?ai:(?P<tail>" + "|".join(sorted(map(re.escape, tails), key=len, reverse=True)) + r"))"
        r"(?P<quote>\\*[\"'])? ?(?P<join>[:=])[ \t]*"
    )
    for word, tails in KEY_TAILS.items()
}
#: Characters of a key name written in a text (scanned back from its tail).
_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
#: Key names that are ordinary words in prose (``each token: ...``): unquoted before ``:``, not taken as a key.
_PROSE_KEYS = frozenset({"token", "sig", "signature"})
#: An unquoted value: an optional auth scheme (``Bearer``), then up to a space, quote, bracket or separator.
_BARE_VALUE = re.compile(r"(?ai:(?:bearer|basic|token|digest|negotiate)[ \t]+)?[^\s,;&\"'<>(){}\[\]]+")
#: An unquoted value after ``Key:`` (a header or YAML line): the rest of the line, up to a flow mapping's end.
_LINE_VALUE = re.compile(r"[^\r\n,;}\]]*[^\s,;}\]]")
#: Unquoted values that hold nothing to hide (``api_key=None`` in a repr).
_EMPTY_VALUES = frozenset({"none", "null", "true", "false", "nil", "undefined"})

#: Substrings every match of the OpenAI/Anthropic and AWS patterns above contains.
TRIGGERS = ("sk-", "AKIA")
#: What every Hugging Face and GitHub token match contains (one regex search, not one per ``_``).
TOKEN_TAIL = re.compile(r"_[A-Za-z0-9]{20}")
#: A ``scheme://user:password@host`` match is followed by the first and holds the second (searched only then).
URL_GATE, URL_TRIGGER = "@", "://"
#: What every match of the any-case patterns contains, lower-cased. A string holding none of these triggers
#: cannot match a built-in pattern (``tests/tracer/record/test_redact_scan.py`` holds it to that).
FOLDED_TRIGGERS = ("earer", "asic")

#: Parts of an environment variable name (split at ``_``) that make its value a secret.
SECRET_ENV_PARTS = frozenset({
    "KEY", "APIKEY", "TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASS", "PWD", "PASSPHRASE", "CREDENTIAL",
    "CREDENTIALS", "CRED", "CREDS", "AUTH", "COOKIE", "SESSION", "PRIVATE", "SIGNATURE", "SIG", "SK", "DSN",
    "WEBHOOK", "CONNECTION"
})  # fmt: skip
#: Environment names that look secret by the rule above but hold ordinary values.
NOT_SECRET_ENV = frozenset({"PWD", "OLDPWD", "SSH_AUTH_SOCK", "KEYTIMEOUT"})

#: Environment variable names ending like a secret.
SECRET_ENV_PATTERN = re.compile(r"(?i)(api_?key|token|secret|password|passwd|credentials?)$")

#: Shortest environment value treated as a secret (shorter ones match too much).
MIN_SECRET_LEN = 8
#: Shortest environment value treated as a secret by its shape alone.
MIN_RANDOM_LEN = 20


def is_secret_env_name(name: str) -> bool:
    """True when an environment variable's name says its value is a secret."""
    upper = name.upper()
    if upper in NOT_SECRET_ENV:
        return False
    parts = set(re.split(r"[_\-.]+", upper))
    return bool(parts & SECRET_ENV_PARTS) or bool(SECRET_ENV_PATTERN.search(name))


def looks_random(value: str) -> bool:
    """True for a value shaped like a generated credential: long, no spaces, high entropy; not a path or URL."""
    if len(value) < MIN_RANDOM_LEN or any(c.isspace() for c in value):
        return False
    if value[0] in "/~." or "://" in value or os.sep in value or os.pathsep in value:
        return False
    classes = sum((any(c.islower() for c in value), any(c.isupper() for c in value), any(c.isdigit() for c in value)))
    if classes < 2 or (classes == 2 and len(value) < 32):
        return False
    entropy = -sum(n / len(value) * math.log2(n / len(value)) for n in collections.Counter(value).values())
    return entropy >= 3.5


def secret_env_values(environ: dict[str, str] | None = None) -> list[str]:
    """Values of secret environment variables (by name or by shape), longest first."""
    env = os.environ if environ is None else environ
    values = {
        v
        for k, v in env.items()
        if len(v) >= MIN_SECRET_LEN and v.strip() and (is_secret_env_name(k) or looks_random(v))
    }
    return sorted(values, key=len, reverse=True)


class Redactor:
    """Replaces secrets in strings; built once per recorder from the config's ``extra_patterns`` (more regular
    expressions) and the secret values of ``environ`` (default ``os.environ``)."""

    def __init__(self, extra_patterns: Iterable[str] = (), environ: dict[str, str] | None = None) -> None:
        values = secret_env_values(environ)
        extra = list(extra_patterns)
        parts = [*map(re.escape, values), *SECRET_VALUE_PATTERNS, *extra]
        self._pattern = re.compile("|".join(f"(?:{p})" for p in parts))
        # Text holding no trigger skips the regex; configured patterns have no known trigger.
        self._scan = None if extra else TriggerScan((*TRIGGERS, *values))
        #: RE2 patterns one of which every text some rule changes matches (None with configured patterns).
        self.gate = None if extra else gate_patterns(values)
        self._folded = TriggerScan(FOLDED_TRIGGERS)

    def records_to_scan(self, strings: list[list[str]], opaque: set[int]) -> list[bool] | None:
        """Which records may hold a secret, from record i's strings ``strings[i]``; None: no record.

        Long chunks: one RE2 search of :attr:`gate` over all records; short ones are redacted to decide.
        ``opaque`` records (text the encoder could not list) are always scanned.
        """
        n = len(strings)
        if self.gate is None:
            return [True] * n
        joined = ["\x00".join(s) for s in strings]
        may = _search_all(self.gate, joined) if sum(map(len, joined)) >= GATE_MIN_CHARS else None
        if may is None:
            blob = "\x00".join(joined)  # it changes wherever one of the records does
            may = [False] * n if self.text(blob) == blob else [self.text(t) != t for t in joined]
        for i in opaque:
            may[i] = True
        return may if any(may) else None

    def texts(self, values: list[Any]) -> list[Any]:
        """Redact a column of values (non-strings pass unchanged); one redaction of the joined column first."""
        if self._scan is not None:
            blob = "\x00".join(v for v in values if type(v) is str)
            if self.text(blob) == blob:
                return values
        return [self.text(v) if type(v) is str else v for v in values]

    def text(self, value: str) -> str:
        """``value`` with every secret replaced by ``<redacted>``; each rule runs only where its triggers are."""
        scan = self._scan
        if scan is None:
            return self.text_ungated(value)
        lowered = _lower(value)
        clean = redact_key_values(value, lowered)
        if clean is not value:
            value, lowered = clean, _lower(clean)
        if scan.found(value) or TOKEN_TAIL.search(value) is not None or self._folded.found(lowered):
            value = self._pattern.sub(REDACTED, value)
        if URL_GATE in value and URL_TRIGGER in value:
            value = URL_USERINFO.sub(_url_userinfo, value)
        return value

    def text_ungated(self, value: str) -> str:
        """:meth:`text` without the pre-scan: every pattern searched (what the pre-scan must agree with)."""
        value = redact_key_values(value)
        value = self._pattern.sub(REDACTED, value)
        return URL_USERINFO.sub(_url_userinfo, value)

    def pieces(self, pieces: list[str]) -> list[str]:
        """Per-token texts redacted as the one text they spell (see :func:`moved_ends`)."""
        joined = "".join(pieces)
        clean, ends = self.text_and_ends(joined, itertools.accumulate(map(len, pieces)))  # listed only when moved
        return pieces if clean is joined else [clean[a:b] for a, b in zip([0, *ends[:-1]], ends)]

    def text_and_ends(self, text: str, ends: Any) -> tuple[str, Any]:
        """``text`` redacted, with its tokens' ``ends`` (list or 1-D array, last = ``len(text)``) moved to fit."""
        clean = self.text(text)
        if clean == text:
            return text, ends
        return clean, moved_ends(ends if hasattr(ends, "tolist") else list(ends), text, clean)

    def value(self, data: Any, depth: int = 0, done: frozenset[int] | set[int] = frozenset()) -> Any:
        """``data`` (JSON-ready) with every string redacted, keys too; ``done``: ids of strings already redacted."""
        if type(data) is str:
            return data if id(data) in done else self.text(data)
        if depth > 200:
            return data
        if isinstance(data, dict):
            out = {}
            for k, v in data.items():
                key = self.text(k) if type(k) is str else k
                out[key] = REDACTED if type(k) is str and is_secret_key(k) else self.value(v, depth + 1, done)
            return out
        if isinstance(data, (list, tuple)):
            try:  # token ids, logprobs: nothing to redact (of JSON-ready values, only numbers add to a float)
                sum(data, 0.0)
                return data
            except (TypeError, OverflowError):
                return [self.value(v, depth + 1, done) for v in data]
        return data


#: Texts of a chunk shorter than this in all are decided in Python (compiling the RE2 gate costs ~0.1 ms).
GATE_MIN_CHARS = 16384


def gate_patterns(values: Iterable[str] = ()) -> tuple[str, str]:
    """Two RE2 patterns, one of which every text a rule changes matches: a secret key before its ``:``/``=``;
    a trigger of a credential shape or URL credentials, or one of the secret ``values``.

    Letters match in any ASCII case through classes (RE2's ``(?i)`` folds Unicode case, more slowly); two
    searches cost less than one of both.
    """
    sep = "[-_.]*"

    def cased(word: str) -> str:
        return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)

    def before(tail: str) -> str:  # a key ending in ``tail`` is a secret's only after these two letters
        pairs = {e[-len(tail) - 2 : -len(tail)] for e in SECRET_KEY_ENDINGS if e.endswith(tail)}
        return "(?:" + "|".join(sorted(sep.join(map(cased, p)) for p in pairs)) + ")" + sep

    keys = [
        before("key") + cased("key"),
        before("keyid") + cased("key") + "[-_]?" + cased("id"),
        *sorted((cased(t) for w, ts in KEY_TAILS.items() if w != "key" for t in ts), key=len, reverse=True),
    ]
    triggers = [
        *map(re.escape, TRIGGERS),
        TOKEN_TAIL.pattern,
        *map(cased, FOLDED_TRIGGERS),
        re.escape(URL_TRIGGER) + _USERINFO + URL_GATE,
        *("".join(f"\\x{{{ord(c):x}}}" for c in v) for v in values),
    ]
    return "(?:" + "|".join(keys) + r")(?:\\*[\"'])? ?[:=]", "|".join(triggers)


def _search_all(patterns: Iterable[str], texts: list[str]) -> list[bool] | None:
    """Whether one of the RE2 ``patterns`` occurs in each of ``texts`` (pyarrow); None where pyarrow refuses them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        array = pa.array(texts, pa.large_string())
        found = None
        for pattern in patterns:
            hit = pc.match_substring_regex(array, pattern)
            found = hit if found is None else pc.or_(found, hit)
    except (pa.ArrowException, UnicodeError, ValueError, TypeError):  # lone surrogates, say
        return None
    return [True] * len(texts) if found is None else found.to_pylist()


#: Characters ranked from rarest to commonest in prompts and replies: a trigger is searched for at its rarest.
_RARE_FIRST = "=_-:/@#$%&|~^`\\KQJZXVWYUFGBHPRMDCLNOISTAEqjzxkvwyfgbpumcldhrsnioate"
#: Occurrences of one anchor character checked one by one before its triggers are searched for whole instead.
MAX_ANCHOR_HITS = 16
#: A trigger whose rarest character ranks past this is searched for whole.
_ANCHOR_RANK_LIMIT = _RARE_FIRST.index("T")


class TriggerScan:
    """``any(t in text for t in triggers)``, with one pass per anchor character (a trigger's rarest) instead of one
    per trigger; where the anchor is common in a text, the triggers it anchors are searched for whole.
    """

    def __init__(self, triggers: Iterable[str]) -> None:
        #: anchor -> {(offset of the anchor in the trigger, trigger length): triggers}
        self.anchored: dict[str, dict[tuple[int, int], set[str]]] = {}
        self.whole: list[str] = []
        for t in dict.fromkeys(triggers):
            # -1: a character outside the ranking (rare: non-ASCII, digits) is best
            rank, i = min(
                ((_RARE_FIRST.index(c) if c in _RARE_FIRST else -1, n) for n, c in enumerate(t)), default=(0, 0)
            )
            if not t or rank > _ANCHOR_RANK_LIMIT or len(t) > 64:
                self.whole.append(t)
            else:
                self.anchored.setdefault(t[i], {}).setdefault((i, len(t)), set()).add(t)

    def found(self, text: str) -> bool:
        """True when some trigger occurs in ``text``."""
        for t in self.whole:
            if t in text:
                return True
        for anchor, groups in self.anchored.items():
            pos = text.find(anchor)
            hits = 0
            while pos != -1:
                for (i, n), ts in groups.items():
                    if pos >= i and text[pos - i : pos - i + n] in ts:
                        return True
                hits += 1
                if hits > MAX_ANCHOR_HITS:  # a common character here: its triggers are searched for whole
                    start = max(0, pos - 64)
                    if any(text.find(t, start) != -1 for ts in groups.values() for t in ts):
                        return True
                    break
                pos = text.find(anchor, pos + 1)
        return False


def _common_length(a: str, b: str, limit: int, window: Callable[[str, int, int], str]) -> int:
    """The largest ``k <= limit`` whose first (or last) ``k`` characters ``a`` and ``b`` share, by bisection of
    ``window(s, i, j)``: characters ``i:j`` from that end."""
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if window(a, lo, mid) == window(b, lo, mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def moved_ends(ends: Any, old: str, new: str) -> Any:
    """Token ends in ``old`` (a list or 1-D numpy array, as given) moved to ``new``, which differs from it in one
    stretch: the token where it starts shows the stretch, the others it covers ``""``, none the secret.
    """
    n = len(ends)
    if n == 0:
        return ends
    limit = min(len(old), len(new))
    head = _common_length(old, new, limit, lambda s, i, j: s[i:j])
    tail = _common_length(old, new, limit - head, lambda s, i, j: s[len(s) - j : len(s) - i])
    i2, j2 = len(old) - tail, len(new) - tail
    first = min(bisect.bisect_right(ends, head), n - 1)
    last = max(first, min(bisect.bisect_left(ends, i2), n - 1))
    delta = j2 - i2
    if not isinstance(ends, list):
        out = ends.copy()
        out[first:last] = j2
        out[last:] += delta
        return out
    return [*ends[:first], *([j2] * (last - first)), *(int(e) + delta for e in ends[last:])]


def _url_userinfo(match: re.Match[str]) -> str:
    """A :data:`URL_USERINFO` match redacted where a scheme (a letter among scheme characters) ends at it."""
    text, k = match.string, match.start()
    while k > 0 and text[k - 1] in _SCHEME_CHARS:
        k -= 1
        if text[k].isalpha():
            return "://" + REDACTED
    return match.group()


def redact_key_values(text: str, lowered: str | None = None) -> str:
    """``text`` with the value of every secret-named key written in it (JSON, reprs, forms, headers) replaced:
    inside its quotes, or a bracketed one whole. ``lowered``: :func:`_lower` of ``text``, where the caller has it.
    """
    out: list[str] = []
    done = 0
    for m in key_values(text, lowered):
        start = m.start()
        if start < done:
            continue
        while start > 0 and text[start - 1] in _KEY_CHARS:
            start -= 1
        if start > 0 and text[start - 1] == "\\" and text[start] in "ntrbf":
            start += 1  # a key after an escaped line break (``\npass: ...`` in JSON or a repr)
        key, quote = text[start : m.end("tail")], m.group("quote")
        value_at = m.end()
        if (
            value_at >= len(text)
            or text[value_at] == m.group("join")  # ``==``, ``::``
            or (quote is None and m.group("join") == ":" and key.lower() in _PROSE_KEYS)
            or not is_secret_key(key)
        ):
            continue
        lo, hi, wrap = _value_span(text, value_at, quote, m.group("join"))
        value = text[lo:hi]
        if not value or value == REDACTED or value.lower() in _EMPTY_VALUES:
            continue
        out.append(text[done:lo])
        out.append(f"{wrap}{REDACTED}{wrap}")
        done = hi
    if not out:
        return text
    out.append(text[done:])
    return "".join(out)


def key_values(text: str, lowered: str | None = None) -> list[re.Match[str]]:
    """Where ``text`` writes a key ending like a secret's with a value after it (any letter case), in order."""
    if ":" not in text and "=" not in text:  # two C scans spare the eleven below (prose)
        return []
    if lowered is None:
        lowered = _lower(text)
    found = []
    for word, pattern in _KEY_VALUE.items():
        pos = lowered.find(word)
        while pos != -1:
            m = pattern.match(text, pos)
            if m is not None:
                found.append(m)
            pos = lowered.find(word, pos + 1)
    if len(found) > 1:
        found.sort(key=lambda m: m.start())
    return found


def _lower(text: str) -> str:
    """``text`` lower-cased, its characters where they were (ASCII letters only where a lower case is longer)."""
    lowered = text.lower()
    return lowered if len(lowered) == len(text) else text.translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def _value_span(text: str, at: int, key_quote: str | None, join: str) -> tuple[int, int, str]:
    """Where the value written at ``text[at]`` starts and ends, and the quote its replacement takes."""
    j = at
    while j < len(text) and text[j] == "\\":
        j += 1
    if j < len(text) and text[j] in "\"'":
        escapes, mark = j - at, text[j]
        k = j + 1
        while True:
            k = text.find(mark, k)
            if k == -1:
                return j + 1, len(text), ""
            back = 0
            while text[k - 1 - back] == "\\":
                back += 1
            if back <= escapes:  # a quote escaped deeper belongs inside the value
                return j + 1, k - escapes, ""
            k += 1
    # A value that is not a string keeps the key's mapping valid as a quoted placeholder.
    wrap = key_quote or ""
    if at < len(text) and text[at] in "([{":
        return at, _group_end(text, at), wrap
    m = (_LINE_VALUE if key_quote is None and join == ":" else _BARE_VALUE).match(text, at)
    end = at if m is None else m.end()
    if end < len(text) and text[end] in "([{" and end > at:
        end = _group_end(text, end)
    return at, end, wrap


def _group_end(text: str, at: int) -> int:
    """The end of the bracketed group opening at ``text[at]`` (the text's end when it never closes)."""
    depth = 0
    for k in range(at, len(text)):
        c = text[k]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return k + 1
    return len(text)


#: A key whose last word is ``pass`` (``db_pass``, ``dbPass``, ``PASS``), not one ending in it (``bypass``).
_PASS_WORD = re.compile(r"(?:^|[\s_.\-])(?i:pass)$|[a-z0-9]Pass$")


@functools.lru_cache(maxsize=8192)
def is_secret_key(key: str) -> bool:
    """True when a mapping key names a secret (``api_key``, ``SecretAccessKey``, ``Set-Cookie``, ``auth``, ...)."""
    return (
        bool(_KEY_ENDING.search(_KEY_STRIP.sub("", key).lower()))
        or bool(SECRET_KEY_PATTERN.match(key))
        or bool(_PASS_WORD.search(key))
    )
