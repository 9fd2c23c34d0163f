"""The arithmetic tracer.integrations.trl shares with TRL: group keys across processes and the weighted total reward."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("trl")

import torch  # noqa: E402

from tracer.integrations.trl import GenerationBatch, weighted_total  # noqa: E402


@given(groups=st.integers(1, 6), group_size=st.integers(1, 5), processes=st.integers(1, 4), first=st.integers(0, 50))
def test_every_completion_of_a_batch_gets_its_own_group_and_index(
    groups: int, group_size: int, processes: int, first: int
) -> None:
    """Split over any number of processes, the rows of a batch map one to one onto (group, 0..group_size-1), groups consecutive."""
    total = groups * group_size * processes
    rows = total // processes
    keys = [
        GenerationBatch(1, False, group_size, first, p * rows).keys(i) for p in range(processes) for i in range(rows)
    ]
    assert keys == [(first + r // group_size, r % group_size) for r in range(total)]
    assert len(set(keys)) == total


values = st.lists(st.one_of(st.none(), st.floats(-1e6, 1e6)), min_size=1, max_size=5)


@given(data=st.data(), row=values)
def test_the_total_is_trls_weighted_nansum(data: st.DataObject, row: list[float | None]) -> None:
    """For any values (None where a function gave none) and weights: TRL's nansum of value x weight, NaN when none."""
    weights = data.draw(st.lists(st.floats(-10, 10), min_size=len(row), max_size=len(row)))
    mine = weighted_total(row, weights)
    tensor = torch.tensor([[math.nan if v is None else v for v in row]], dtype=torch.float64)
    theirs = (tensor * torch.tensor(weights, dtype=torch.float64)).nansum(dim=1)
    if all(v is None for v in row):
        assert math.isnan(mine)
    else:
        assert mine == pytest.approx(theirs.item(), rel=1e-9, abs=1e-6)
