"""Is the MLflow tracking destination there? Asked once before any MLflow call: ``/health`` answers in seconds, where
MLflow's HTTP client retries a refused connection for minutes."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request

#: Seconds to wait for ``/health`` of a tracking server.
PROBE_TIMEOUT_S = 5.0
#: URI schemes MLflow's tracking client knows (others are a typo or a plugin).
_KNOWN_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "file", "databricks", "databricks-uc", "")


class TrackingUriError(ConnectionError):
    """The tracking URI is malformed, or the server it names does not answer."""


def check_tracking_uri(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise :class:`TrackingUriError` naming ``uri`` when it cannot be used: an ``http(s)`` URI must answer
    ``GET /health`` within ``timeout_s``; other schemes are left to MLflow."""
    try:
        parts = urllib.parse.urlsplit(uri)
        scheme = parts.scheme.lower()
        port = parts.port if scheme in ("http", "https") else None
    except ValueError as exc:
        raise TrackingUriError(f"MLflow tracking URI {uri!r} is malformed ({exc}); {_HINT}") from None
    if scheme.split("+")[0] not in _KNOWN_SCHEMES and len(scheme) > 1:  # one letter: a Windows drive
        raise TrackingUriError(f"MLflow tracking URI {uri!r} has an unknown scheme {scheme!r}; {_HINT}")
    if scheme not in ("http", "https"):
        return
    if not parts.hostname:
        raise TrackingUriError(f"MLflow tracking URI {uri!r} names no host; {_HINT}")
    health = urllib.parse.urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + "/health", "", ""))
    try:
        with urllib.request.urlopen(health, timeout=timeout_s):  # noqa: S310 - the scheme is http(s), checked above
            return
    except urllib.error.HTTPError:
        return  # it answered: a server (maybe behind a proxy without /health); MLflow's calls say the rest
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        where = f"{parts.hostname}:{port}" if port else parts.hostname
        raise TrackingUriError(
            f"MLflow tracking server {uri} does not answer ({where}: {reason}); start it "
            f"(mlflow server --host {parts.hostname} --port {port or 80}) or give the right --tracking-uri"
        ) from None


_HINT = "give e.g. http://127.0.0.1:5000 (an mlflow server) or sqlite:///mlflow.db (a local file)"
