"""`rollout-trace bundle`: one self-contained HTML file that opens without a server or a network."""

from __future__ import annotations

import os
import re
import time
from typing import Any

import pytest
from viewer_fixtures import HOSTILE_TEXT, record_run

import tracer
from tracer.questions import questions_and_answers
from viewer import bundle
from viewer.screenshots import chromium, chromium_path, wait_for


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A run whose rollout 0 answers with HTML and Markdown."""
    return record_run(tmp_path_factory.mktemp("bundle"), steps=2, prompts=2, group=2)


def test_bundle_holds_questions_answers_and_the_run_config(demo_dir: str, tmp_path: Any) -> None:
    """A step's bundle has each trajectory's question, final answer, group table and the run's config."""
    out = os.fspath(tmp_path / "b.html")
    assert bundle.main([demo_dir, "--step", "2", "-o", out]) == 0
    text = _read(out)
    qa = questions_and_answers(tracer.read_spans(demo_dir, steps=[2]))
    for question, answer in qa.values():
        assert bundle._e(question) in text and bundle._e(answer) in text
    assert "Run config" in text and "few_shot" in text
    assert not re.search(r"""(src|href)\s*=\s*['"]?(https?:)?//""", text)  # no remote resource


def test_bundle_escapes_every_model_string(hostile_run: str, tmp_path: Any) -> None:
    """Model text with tags and scripts is written escaped: the only script is the bundle's own."""
    out = os.fspath(tmp_path / "b.html")
    assert bundle.main([hostile_run, "-o", out]) == 0
    text = _read(out)
    assert HOSTILE_TEXT not in text
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in text
    assert text.count("<script>") == 1


def test_bundle_over_its_bound_is_refused_with_the_size(hostile_run: str, tmp_path: Any, capsys: Any) -> None:
    """A bundle over --max-mb is not written; the error names its size and how to choose less."""
    out = tmp_path / "b.html"
    assert bundle.main([hostile_run, "-o", os.fspath(out), "--max-mb", "0.001"]) == 2
    err = capsys.readouterr().err
    assert "over the 0.001 MB bound" in err and "--trace-id" in err
    assert not out.exists()


def test_bundle_of_chosen_trace_ids(hostile_run: str, tmp_path: Any) -> None:
    """--trace-id picks trajectories; an id that matches nothing exits 2."""
    tid = tracer.read_trajectories(hostile_run, steps=[1]).column("trace_id")[0].as_py()
    out = os.fspath(tmp_path / "b.html")
    assert bundle.main([hostile_run, "--trace-id", tid, "-o", out]) == 0
    assert _read(out).count("class='trajectory'") == 1
    assert bundle.main([hostile_run, "--trace-id", "nope", "-o", out]) == 2


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(chromium_path() is None, reason="headless Chromium is not installed (apt-get install -y chromium)")
def test_bundle_opens_from_disk_with_the_network_off(demo_dir: str, tmp_path: Any) -> None:
    """Headless Chromium, offline, opens the bundle from a file and shows a question and an answer; nothing is fetched."""
    out = os.fspath(tmp_path / "b.html")
    assert bundle.main([demo_dir, "--step", "1", "-o", out]) == 0
    question, answer = next(iter(questions_and_answers(tracer.read_spans(demo_dir, steps=[1])).values()))
    with chromium(os.fspath(tmp_path / "chromium")) as b:
        b.call("Target.createTarget", url="about:blank")
        b.open("about:blank")
        b.call("Network.enable")
        b.call("Network.emulateNetworkConditions", offline=True, latency=0, downloadThroughput=-1, uploadThroughput=-1)
        b.call("Page.navigate", url="file://" + out)
        text = wait_for(lambda: (b.evaluate("document.body && document.body.innerText") or "") or None, 60, "page")
        time.sleep(0.5)
        text = b.evaluate("document.body.innerText")
        assert question in text and answer in text
        assert b.evaluate("performance.getEntriesByType('resource').length") == 0
        shot = b.screenshot()
    os.makedirs(os.path.join(tmp_path, "artifacts"), exist_ok=True)
    with open(os.path.join(tmp_path, "artifacts", "bundle.png"), "wb") as f:
        f.write(shot)
