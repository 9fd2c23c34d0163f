"""check and the readers agree: a file whose column types the readers cannot use is damage to both."""

from __future__ import annotations

import os
import warnings

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracer
from tracer import schema as S
from tracer.storage.check import check_path
from tracer.storage.files import compatible

OTHER_TYPES = (pa.string(), pa.large_string(), pa.int32(), pa.int64(), pa.float64(), pa.bool_(), pa.binary(), pa.null())


def _write(path: str, types: dict[str, pa.DataType]) -> None:
    fields = [pa.field(f.name, types.get(f.name, f.type)) for f in tracer.schema.SPAN_SCHEMA]
    schema = pa.schema(fields, metadata={S.META_SCHEMA_VERSION: S.SCHEMA_VERSION})
    table = pa.table({f.name: pa.nulls(2, f.type) for f in fields}, schema=schema)
    with pa.OSFile(path, "wb") as f, pa.ipc.new_stream(f, schema) as w:
        w.write_table(table)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(column=st.sampled_from(S.SPAN_COLUMNS), typ=st.sampled_from(OTHER_TYPES))
def test_check_and_readers_agree_on_column_types(
    tmp_path_factory: pytest.TempPathFactory, column: str, typ: pa.DataType
) -> None:
    """One column of any other type: check says OK exactly when the readers return the rows without a warning."""
    path = os.path.join(str(tmp_path_factory.mktemp("types")), "x.arrow")
    _write(path, {column: typ})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = tracer.read_spans(path)
    usable = compatible(typ, S.SPAN_SCHEMA.field(column).type)
    report = check_path(path)
    assert (not report.damaged) == usable == (table.num_rows == 2) == (not caught)
    if not usable:
        assert column in str(caught[0].message) and column in report.files[0].damage
        assert report.spans == 0


def test_a_mistyped_file_is_named_with_its_column(
    tmp_path: os.PathLike[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`rollout-trace check` names the column and both types; the reader's warning claims no span it did not return."""
    from tracer.cli import main

    path = os.path.join(os.fspath(tmp_path), "x.arrow")
    _write(path, {S.START_NS: pa.string()})
    assert main(["check", path]) == 1
    out = capsys.readouterr().out
    assert "column 'start_ns' is string, readers need int64" in out
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert tracer.read_spans(path).num_rows == 0
    assert "recovered" not in str(caught[0].message) and "start_ns" in str(caught[0].message)
