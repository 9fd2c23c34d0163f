"""`compact --ray` and `compact s3://...` say what is wrong and what to set: no Ray, no cluster, no endpoint."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from scale_fixtures import REPO, need
from server_fixtures import free_port

from tracer.cli import main
from tracer.extras import install_command
from tracer.storage.compact_ray import ClusterUnreachableError, check_reachable


def _run_dir(tmp_path: Any, write_trace: Any) -> str:
    run = os.path.join(str(tmp_path), "run")
    os.makedirs(run)
    write_trace(os.path.join(run, "a.arrow"), 1)
    return run


def test_an_unreachable_cluster_is_named_at_once(
    tmp_path: Any, write_trace: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """--ray-address where nothing listens exits 2 naming the address (Ray alone retries for minutes)."""
    need("ray", "ray")
    address = f"127.0.0.1:{free_port()}"
    run = _run_dir(tmp_path, write_trace)
    listed = sorted(os.listdir(run))
    assert main(["compact", run, "--ray", "--ray-address", address]) == 2
    err = capsys.readouterr().err
    assert address in err and "ray start --head" in err and "--ray-address" in err
    assert sorted(os.listdir(run)) == listed  # nothing touched


def test_an_address_that_is_not_host_port_says_what_to_give() -> None:
    """A malformed address names itself and the expected shape."""
    with pytest.raises(ValueError, match=r"'nonsense' is not host:port.*6379"):
        check_reachable("nonsense")
    with pytest.raises(ClusterUnreachableError, match="ray://127.0.0.1"):
        check_reachable(f"ray://127.0.0.1:{free_port()}", timeout_s=2)


def test_without_ray_installed_the_error_gives_the_install_command(tmp_path: Any, write_trace: Any) -> None:
    """With ray not importable, `compact --ray` exits 2 with the pip line for the ray extra."""
    run = _run_dir(tmp_path, write_trace)
    code = (
        "import sys; sys.modules['ray'] = None\n"  # what an environment without ray looks like to `import ray`
        "from tracer.cli import main\n"
        f"sys.exit(main(['compact', {run!r}, '--ray']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 2, proc.stderr
    assert "needs the 'ray' package" in proc.stderr and install_command("ray") in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_an_endpoint_that_does_not_answer_names_the_bucket_and_the_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """compact of an s3:// URI whose endpoint is down exits 2 naming the bucket and AWS_ENDPOINT_URL."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    for key, value in (("AWS_ACCESS_KEY_ID", "k"), ("AWS_SECRET_ACCESS_KEY", "s"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    bucket = f"down-{free_port()}"  # a name of its own: filesystems are cached per URI
    assert main(["compact", f"s3://{bucket}/traces"]) == 2
    err = capsys.readouterr().err
    assert f"bucket {bucket!r}" in err and "AWS_ENDPOINT_URL" in err and "did not answer" in err
