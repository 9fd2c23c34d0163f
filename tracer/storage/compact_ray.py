"""``rollout-trace compact --ray``: the same compaction, its merges run as Ray tasks on a cluster.

The driver alone plans, writes ``_index.json``, renames and deletes (:func:`~tracer.storage.compact.compact_dirs`);
each task runs one :func:`~tracer.storage.compact.merge_unit`, so a task that dies changes neither index nor input.
Workers must reach the same files as the driver (the same bucket and ``AWS_*`` settings, or a shared filesystem)."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

from tracer.extras import install_command
from tracer.storage.compact import (
    DEFAULT_TARGET_BYTES,
    CompactReport,
    MergeResult,
    MergeUnit,
    compact_dirs,
    describe_store_error,
    merge_unit,
    run_dirs,
    write_parquet,
)
from tracer.storage.uri import is_remote

#: How many times Ray reruns a merge whose worker died before it counts as failed (Ray's own default).
DEFAULT_RETRIES = 3
CONNECT_TIMEOUT_S = 5.0
#: Environment variable Ray itself reads for the cluster's address.
ENV_RAY_ADDRESS = "RAY_ADDRESS"


class ClusterUnreachableError(ConnectionError):
    """The Ray cluster at the given address did not answer."""


def check_reachable(address: str | None, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Fail fast (Ray itself retries for minutes) with ClusterUnreachableError when nothing answers at ``address``
    (``host:port`` or ``ray://host:port``; else ValueError); ``None``, ``""``, ``"auto"`` and ``"local"`` pass."""
    if not address or address in ("auto", "local"):
        return
    host, _, port = address.split("://", 1)[-1].rstrip("/").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(
            f"Ray address {address!r} is not host:port; give the head node's address "
            "(e.g. 10.0.0.5:6379, or ray://10.0.0.5:10001 for Ray Client)"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ClusterUnreachableError(
            f"cannot reach a Ray cluster at {address!r} ({exc}); start one there (ray start --head) "
            f"or give the head node's address with --ray-address (or ${ENV_RAY_ADDRESS})"
        ) from None


@contextlib.contextmanager
def connected(address: str | None) -> Iterator[Any]:
    """The ``ray`` module, connected for the block to the cluster at ``address`` (default: join or start one here;
    one already initialised is used and left up); ImportError names the install command."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            f"compact --ray needs the 'ray' package, which is not installed ({exc}); "
            f"install it with: {install_command('ray')}"
        ) from None
    if ray.is_initialized():
        yield ray
        return
    check_reachable(address or os.environ.get(ENV_RAY_ADDRESS))
    ray.init(address=address, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def compact_ray(
    path: str | os.PathLike[str],
    address: str | None = None,
    target_bytes: int = DEFAULT_TARGET_BYTES,
    seal_after_s: float | None = None,
    delete_after_s: float | None = None,
    retries: int = DEFAULT_RETRIES,
    merge: Callable[[MergeUnit], MergeResult] = merge_unit,
) -> CompactReport:
    """Compact every run directory under ``path`` (a URI or a path every node sees) with one Ray task per merge.
    ``address`` defaults to ``$RAY_ADDRESS``, else a cluster here; ``retries``: reruns of a task whose worker died;
    ``merge``: what each task runs (a wrapper of the default). Failed merges are in :attr:`CompactReport.failed`."""
    dirs = run_dirs(path)  # a bad path fails before a cluster is started
    with connected(address) as ray:
        task = ray.remote(num_cpus=1, max_retries=retries)(merge)

        def merges(units: list[MergeUnit]) -> Iterator[tuple[MergeUnit, MergeResult | str]]:
            pending = {task.remote(unit): unit for unit in units}
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                unit = pending.pop(ready[0])
                try:
                    result: MergeResult | str = ray.get(ready[0])
                except ray.exceptions.RayError as exc:
                    result = _describe(unit.run_dir, exc)
                yield unit, result

        return compact_dirs(dirs, target_bytes, seal_after_s, delete_after_s, merges)


def write_parquet_ray(
    path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None, address: str | None = None
) -> tuple[str, int]:
    """:func:`tracer.storage.compact.write_parquet` as one Ray task on the cluster; returns (directory, rows)."""
    with connected(address) as ray:
        result: tuple[str, int] = ray.get(ray.remote(num_cpus=1)(write_parquet).remote(path, out))
    return result


def _describe(run_dir: str, exc: BaseException) -> str:
    """One line for a failed task: the error inside it (a store's error with what to set)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        exc = cause
    if isinstance(exc, OSError) and is_remote(run_dir):
        return describe_store_error(run_dir, exc)
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:400]}"


__all__ = ["ClusterUnreachableError", "DEFAULT_RETRIES", "check_reachable", "compact_ray", "write_parquet_ray"]
