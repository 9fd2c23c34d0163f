"""Fixtures of the integration tests: one local Ray cluster per module that asks for it.

Module scope, not session: other folders' modules (tests/tracer/storage/test_compact_ray.py)
start a cluster of their own with ``ray.init``, which fails while another is up in the process.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from scale_fixtures import REPO, need

import tracer

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS_DIR = os.path.abspath(os.path.join(HERE, "..", ".."))


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A local 2-CPU Ray cluster for the module, this process its first job, whose runtime environment carries the trace config and the verl hook.

    Yields the trace folders of that job (``env``: from the runtime environment,
    ``explicit``: for a config passed by hand) and the cluster's ``address``,
    which other jobs (a verl driver in a subprocess) join with ``ray.init(address=...)``.
    """
    need("ray", "ray")
    import ray

    root = tmp_path_factory.mktemp("ray")
    dirs = {"env": str(root / "from_env"), "explicit": str(root / "explicit")}
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={
            "worker_process_setup_hook": "tracer.integrations.verl.install",
            "env_vars": {
                tracer.ENV_TRACE_DIR: dirs["env"],
                tracer.ENV_BACKEND: "arrow",
                tracer.config.ENV_CONFIG: json.dumps(
                    {"project_name": "ray", "experiment_name": "env", "flush_interval_s": 0.2}
                ),
                tracer.config.ENV_STRICT: "1",
                # Workers unpickle the test modules' functions by reference.
                "PYTHONPATH": os.pathsep.join([HERE, TESTS_DIR, REPO, os.environ.get("PYTHONPATH", "")]),
            },
        },
    )
    try:
        yield {**dirs, "address": ray.get_runtime_context().gcs_address}
    finally:
        ray.shutdown()
