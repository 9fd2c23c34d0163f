"""Live exporters fed from the recorder: each durable batch to every driver, flushed and shut down together."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from tracer.record.accounting import ProblemLog

if TYPE_CHECKING:
    from tracer.exporters.base import Driver


class Fanout:
    """The live drivers of one recorder (one per backend); a driver's failure is counted in ``problems``."""

    def __init__(self, problems: ProblemLog) -> None:
        self.drivers: list[Driver] = []
        self.problems = problems

    def add(self, driver: Driver) -> None:
        """Feed ``driver`` each batch from now on."""
        self.drivers.append(driver)

    def export(self, batch: pa.RecordBatch) -> None:
        """Hand a durable batch to every driver (writer thread)."""
        for driver in self.drivers:
            try:
                driver.export(batch)
            except Exception as exc:
                self.problems.report("exporter error", f"{type(driver).__qualname__}: {exc}", exc)

    def flush(self, timeout: float | None) -> list[str]:
        """Flush every driver within ``timeout`` in total; what each failed to take (empty: all of it)."""
        if not self.drivers:
            return []
        from tracer.exporters.bounded import flush_drivers

        return flush_drivers(self.drivers, timeout)

    def shutdown(self, timeout: float | None) -> None:
        """Stop every driver within ``timeout`` in total; failures are counted."""
        if not self.drivers:
            return
        from tracer.exporters.bounded import shutdown_drivers

        for line in shutdown_drivers(self.drivers, timeout):
            self.problems.report("exporter shutdown failed", line)
