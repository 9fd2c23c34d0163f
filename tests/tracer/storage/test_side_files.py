"""Hostile side files (FIFOs, links to /dev/zero, devices, huge or ill-typed files) never hang or break a reader."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import tempfile
import threading
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from index_fixtures import trace_span, write_shard

from tracer import schema as S
from tracer.cli.info import run_info
from tracer.exporters.lag import read_lag
from tracer.index.readers import read_step_partials, read_trajectories
from tracer.index.rollup import ROLLUP_NAME
from tracer.index.shard import shard_index_path
from tracer.read import read_steps
from tracer.storage import side_files
from tracer.storage.index import INDEX_NAME, load_index

#: A reader that takes longer than this is taken as hung (a FIFO open blocks forever).
HANG_S = 20.0
LAG_NAME = "_lag.mlflow.host_1_abc.json"

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
#: Lag records with one field of a wrong type (a string timestamp, a list count, a bool pid, ...).
BAD_LAG = st.fixed_dictionaries(
    {"backend": st.just("mlflow"), "host": st.just("h"), "pid": st.just(1), "written_at": st.just(1.0)}
).flatmap(
    lambda good: st.sampled_from(sorted(good) + ["shipped", "final", "every_s"]).flatmap(
        lambda key: JSON.filter(lambda v: not _fits(key, v)).map(lambda v: {**good, key: v})
    )
)
#: Indexes whose shape is off: a list, a string, entries that are not objects, fields of wrong types.
BAD_INDEX = st.one_of(
    JSON.filter(lambda v: not (isinstance(v, dict) and isinstance(v.get("files"), dict))),
    st.builds(lambda v: {"version": 1, "files": {"x.arrow": v}}, JSON.filter(lambda v: not isinstance(v, dict))),
    st.builds(
        lambda k, v: {"version": 1, "files": {"x.arrow": {k: v}}},
        st.sampled_from(["size", "replaces", "group", "batch_steps"]),
        st.one_of(st.text(max_size=4), st.booleans(), st.lists(st.integers(), min_size=1, max_size=2)),
    ),
)
KINDS = ["fifo", "link_to_dev_zero", "link_to_file", "directory", "huge", "garbage", "bad_json"]


def _fits(key: str, v: Any) -> bool:
    if key in ("backend", "host"):
        return type(v) is str
    if key == "final":
        return type(v) is bool
    if key in ("written_at", "every_s"):
        return type(v) in (int, float) and (key != "every_s" or v >= 0)
    return type(v) is int


def _run(where: str) -> str:
    run = os.path.join(where, "run")
    spans = [trace_span("a", 0, 1), trace_span("a", 1, 1), trace_span("b", 0, 2)]
    write_shard(run, [spans[:2], spans[2:]])
    return run


def _answers(run: str) -> dict[str, Any]:
    """What the readers, ``info`` and the side-file readers say of ``run``, within :data:`HANG_S`."""
    got: dict[str, Any] = {}

    def read() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", side_files.SideFileWarning)
            got["trajectories"] = read_trajectories(run).select([S.TRACE_ID, S.STEP, S.NUM_SPANS]).to_pylist()
            got["partials"] = read_step_partials(run).to_pylist()
            got["steps"] = read_steps(run)
            got["lag"] = len(read_lag(run))
            got["index"] = load_index(run)["files"]
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                got["info"] = run_info(argparse.Namespace(path=run))

    worker = threading.Thread(target=read, daemon=True)
    worker.start()
    worker.join(HANG_S)
    assert not worker.is_alive(), f"a reader of {run} hung"
    assert set(got) == {"trajectories", "partials", "steps", "lag", "index", "info"}, got
    return got


def _plant(path: str, kind: str, cap: int, content: bytes) -> None:
    """Put a hostile ``kind`` of file at ``path`` (replacing what is there)."""
    if os.path.lexists(path):
        os.remove(path)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link_to_dev_zero":
        os.symlink("/dev/zero", path)
    elif kind == "link_to_file":
        target = path + ".target"
        with open(target, "wb") as f:
            f.write(content)
        os.symlink(os.path.basename(target), path)
    elif kind == "directory":
        os.mkdir(path)
    elif kind == "huge":
        with open(path, "wb") as f:
            f.truncate(cap + 1)  # sparse: costs no disk
    else:
        with open(path, "wb") as f:
            f.write(content)


def _side_files(run: str) -> dict[str, tuple[str, int]]:
    shard = next(os.path.join(run, n) for n in os.listdir(run) if n.endswith(S.FILE_SUFFIX))
    return {
        "index": (os.path.join(run, INDEX_NAME), side_files.MAX_JSON_BYTES),
        "lag": (os.path.join(run, LAG_NAME), side_files.MAX_LAG_BYTES),
        "rollup": (os.path.join(run, ROLLUP_NAME), side_files.MAX_ARROW_BYTES),
        "sidecar": (shard_index_path(shard), side_files.MAX_ARROW_BYTES),
    }


@pytest.fixture(scope="module")
def truth() -> Any:
    where = tempfile.mkdtemp(prefix="rt-side-")
    try:
        yield _answers(_run(where))
    finally:
        shutil.rmtree(where, ignore_errors=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    which=st.sampled_from(["index", "lag", "rollup", "sidecar"]),
    kind=st.sampled_from(KINDS),
    garbage=st.binary(max_size=64),
    data=st.data(),
)
def test_a_hostile_side_file_is_skipped_and_every_reader_answers_as_without_it(
    truth: dict[str, Any], which: str, kind: str, garbage: bytes, data: st.DataObject
) -> None:
    bad: Callable[[], Any] = {"lag": lambda: data.draw(BAD_LAG), "index": lambda: data.draw(BAD_INDEX)}.get(
        which, lambda: data.draw(JSON)
    )
    content = json.dumps(bad()).encode() if kind in ("bad_json", "link_to_file") else garbage
    with tempfile.TemporaryDirectory(prefix="rt-side-") as where:
        run = _run(where)
        path, cap = _side_files(run)[which]
        _plant(path, kind, cap, content)
        assert _answers(run) == truth


@pytest.mark.parametrize("which", ["index", "lag", "rollup", "sidecar"])
@pytest.mark.parametrize("kind", ["fifo", "link_to_dev_zero", "huge"])
def test_a_refused_side_file_is_named_in_a_warning(tmp_path: Any, which: str, kind: str) -> None:
    run = _run(os.fspath(tmp_path))
    path, cap = _side_files(run)[which]
    _plant(path, kind, cap, b"")
    with pytest.warns(side_files.SideFileWarning, match=os.path.basename(path)):
        read_trajectories(run)
        read_steps(run)
        read_lag(run)


@pytest.mark.parametrize("record", [[], "x", {"backend": "mlflow", "host": "h", "pid": 1, "written_at": "yesterday"}])
def test_a_lag_file_of_the_wrong_shape_leaves_info_working(tmp_path: Any, record: Any) -> None:
    """``[]``, a string, or a string timestamp: ``info`` exits 0 and names the file."""
    run = _run(os.fspath(tmp_path))
    with open(os.path.join(run, LAG_NAME), "w") as f:
        json.dump(record, f)
    out = io.StringIO()
    with pytest.warns(side_files.SideFileWarning, match=LAG_NAME), contextlib.redirect_stdout(out):
        assert run_info(argparse.Namespace(path=run)) == 0
    assert "2 trajectories" in out.getvalue()


@pytest.mark.parametrize("which", ["index", "lag"])
@pytest.mark.parametrize("kind", ["fifo", "link_to_dev_zero"])
def test_info_and_the_readers_neither_hang_nor_grow_on_a_fifo_or_dev_zero(
    truth: dict[str, Any], tmp_path: Any, which: str, kind: str
) -> None:
    """A FIFO named ``_index.json`` or ``_lag.*.json`` hung ``info``; a link to ``/dev/zero`` read without end."""
    run = _run(os.fspath(tmp_path))
    path, cap = _side_files(run)[which]
    _plant(path, kind, cap, b"")
    assert _answers(run) == truth
