"""The overview page from per-step aggregates: the same page as from every trajectory row."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from apptest_fixtures import open_app
from viewer_fixtures import record_run

import tracer
from tracer.index.shard import load_shard_index, stored_step_partials
from tracer.summary import zero_std_fractions
from viewer import data as D
from viewer import state
from viewer.format import metric_value


@pytest.fixture(scope="module")
def closed_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A recorded run whose shard is closed, so its index (with the per-step aggregates) is written."""
    path = record_run(tmp_path_factory.mktemp("overview_run"))
    tracer.shutdown()
    yield path


def _cell(v: object) -> object:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


@pytest.mark.parametrize("split", [None, "true", "false"])
def test_the_overview_shows_what_every_trajectory_row_gives(closed_run: str, split: str | None) -> None:
    """Tiles and the per-step table equal the old computation over every trajectory row (both splits and each)."""
    shards = tracer.list_trace_files(closed_run)
    indexes = [load_shard_index(f) for f in shards]
    assert all(i is not None and stored_step_partials(i) is not None for i in indexes)  # the stored path is taken
    at = open_app(closed_run, **({} if split is None else {state.QP_VALIDATE: split}))

    rows = D.select(D.load_trajectories(closed_run).table, None, None if split is None else split == "true")
    span_rows = D.list_steps(closed_run).rows if split is None else None
    want_tiles = D.run_totals(rows, span_rows)
    got_tiles = {m.label: m.value for m in at.metric}
    for k, v in want_tiles.items():
        assert got_tiles[k] == (f"{v:.1%}" if k == "tool error rate" else metric_value(v)), k
    want = D.overview(rows)
    D.with_zero_std(want, zero_std_fractions(rows))  # the page adds it from every trajectory row
    table = next(df.value for df in at.dataframe if "reward/mean" in df.value.columns)
    assert len(table) == len(want) > 0
    for got_row, want_row in zip(table.to_dict("records"), want, strict=True):
        assert {k: _cell(v) for k, v in got_row.items()} == {k: _cell(v) for k, v in want_row.items()}
