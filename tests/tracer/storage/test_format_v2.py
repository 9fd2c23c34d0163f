"""Format version 2: the golden file of every major version reads, v2 is an IPC file, docs/format.md is current.

``python tests/tracer/storage/test_format_v2.py`` rewrites the column table of
docs/format.md from :data:`tracer.schema.SPAN_FIELDS`.
"""

from __future__ import annotations

import os
import sys

import pyarrow as pa
import pyarrow.dataset as pds
import pytest

import tracer
from tracer import schema as S
from tracer.storage.files import major_version, read_batches

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
DOC = os.path.join(ROOT, "docs", "format.md")
GOLDEN_DIR = os.path.join(ROOT, "sample_data", "golden")
BEGIN = "<!-- columns: generated from tracer.schema.SPAN_FIELDS -->"
END = "<!-- end of columns -->"


def column_table() -> str:
    """The markdown table of every span column, from SPAN_FIELDS."""
    lines = ["| column | Arrow type | null | meaning |", "|---|---|---|---|"]
    for name, typ, nullable, doc in S.SPAN_FIELDS:
        lines.append(f"| `{name}` | {typ} | {'yes' if nullable else 'no'} | {doc.replace('|', '/')} |")
    return "\n".join(lines)


def _doc() -> str:
    with open(DOC, encoding="utf-8") as f:
        return f.read()


def test_every_major_version_has_a_golden_file() -> None:
    """Bumping the major version without committing its golden file (tests/make_golden.py) fails here."""
    for major in range(1, major_version(S.SCHEMA_VERSION) + 1):
        assert os.path.isfile(os.path.join(GOLDEN_DIR, f"trace_v{major}.arrow")), (
            f"sample_data/golden/trace_v{major}.arrow is missing: run python tests/make_golden.py"
        )


def test_v2_golden_is_an_ipc_file_and_v1_a_stream() -> None:
    """The v2 file has its footer (engines open it as it is); the v1 file is a stream, read by tracer's readers."""
    v1, v2 = (os.path.join(GOLDEN_DIR, f"trace_v{m}.arrow") for m in (1, 2))
    with pa.memory_map(v2) as source:
        assert pa.ipc.open_file(source).read_all().num_rows == 8
    assert pds.dataset(v2, format="ipc").count_rows() == 8
    with pa.memory_map(v1) as source, pytest.raises(pa.ArrowInvalid):
        pa.ipc.open_file(source)
    for path, as_file in ((v1, False), (v2, True)):
        reading = read_batches(path)
        assert sum(b.num_rows for b in reading) == 8
        assert (reading.result.file_format, reading.result.closed) == (as_file, True)
    assert tracer.read_spans([v1, v2]).num_rows == 16


def test_a_writer_shard_is_current_version(trace_dir: str) -> None:
    """A fresh shard says version 2 and is an IPC file once closed."""
    tracer.init(output_dir=trace_dir)
    tracer.log_reward(1.0, step=0, sample_index="a", rollout_n=0)
    tracer.shutdown()
    (shard,) = tracer.list_trace_files(trace_dir)
    assert tracer.read_file_metadata(shard)[S.META_SCHEMA_VERSION] == S.SCHEMA_VERSION
    assert major_version(S.SCHEMA_VERSION) == 2
    with pa.memory_map(shard) as source:
        assert pa.ipc.open_file(source).num_record_batches >= 1


def test_next_major_version_is_refused_with_the_fix(tmp_path: object) -> None:
    """A file of a newer major is skipped, saying which versions and how to fix it; an older one reads."""
    for version, readable in ((f"{major_version(S.SCHEMA_VERSION) + 1}.0", False), ("1.0", True)):
        path = os.path.join(str(tmp_path), f"v{version}{S.FILE_SUFFIX}")
        schema = S.SPAN_SCHEMA.with_metadata({S.META_SCHEMA_VERSION: version})
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            writer.write_table(schema.empty_table())
        reading = read_batches(path)
        list(reading)
        if readable:
            assert reading.result.skipped == ""
        else:
            assert version in reading.result.skipped and "upgrade rollout-trace" in reading.result.skipped


def test_format_doc_lists_every_column_and_metadata_key() -> None:
    """docs/format.md holds the table SPAN_FIELDS generates, and names every metadata key and the version."""
    doc = _doc()
    assert BEGIN in doc and END in doc, f"docs/format.md lost its {BEGIN} ... {END} markers"
    table = doc.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert table == column_table(), (
        "docs/format.md's column table is stale: python tests/tracer/storage/test_format_v2.py"
    )
    keys = [getattr(S, n) for n in dir(S) if n.startswith(("META_", "BATCH_META_"))]
    keys += [S.ATTR_TRUNCATED, "rollout_trace.compacted_from", "rollout_trace.replaced"]
    missing = [k for k in keys if f"`{k}`" not in doc]
    assert not missing, f"docs/format.md does not describe {missing}"
    assert f"`{S.SCHEMA_VERSION}`" in doc


def _rewrite() -> None:
    doc = _doc()
    head, rest = doc.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    with open(DOC, "w", encoding="utf-8") as f:
        f.write(f"{head}{BEGIN}\n{column_table()}\n{END}{tail}")
    print(f"wrote {DOC}")


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    _rewrite()
