"""Names and free text are shown as text on every page: a run or sweep named with Markdown (a link,
an image that would fetch from a tracker) or HTML is not rendered as such (issue 34)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.store import Store
from dashboard import ui
from engines.settings import get_settings

EVIL = "[win a prize](http://evil.example/phish) ![t](http://tracker.example/p.png) <b>bold</b>"
PAGES = [ui.PAGE_RESULTS, ui.PAGE_SWEEP, ui.PAGE_PROFILING, ui.PAGE_REPLAY, ui.PAGE_COMPARE, ui.PAGE_CONCURRENCY]


def _shown(at: Any) -> list[str]:
    """Every Markdown-rendered text element of a page run (markdown, captions, alerts)."""
    out = []
    for kind in ("markdown", "caption", "info", "warning", "error", "success", "subheader", "header", "title"):
        out += [str(e.value) for e in at.get(kind)]
    return out


@pytest.mark.parametrize("page", PAGES)
def test_a_name_made_of_markdown_is_shown_as_text(
    app_test: Callable[..., Any], fresh_data_dir: Path, page: str
) -> None:
    from tests.dashboard.synthetic import add_synthetic_run

    store = Store(get_settings().db_path)
    rid = add_synthetic_run(store, engine="openai", name=EVIL)
    sweep = store.create_sweep(kind="concurrency", config={"values": [1]}, name=EVIL)
    store.update_sweep(sweep, status="completed")
    at = app_test(page)
    assert not at.exception, at.exception
    for text in _shown(at):
        assert "](http://evil.example" not in text and "](http://tracker.example" not in text, (page, text)
        assert "<b>bold</b>" not in text, (page, text)
    assert rid


def test_viewer_mode_refuses_in_the_services_not_only_in_the_widgets(
    app_test: Callable[..., Any], fresh_data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The actions behind greyed buttons refuse themselves (a crafted click reaches them; AppTest
    cannot send one, so the services are called as the page calls them): the Tuning import
    imports nothing, a viewer saves no upload, the stop service ignores it; the page offers
    no uploader."""
    from dashboard import services

    monkeypatch.setenv("MOEBENCH_MODE", "viewer")
    store = Store(get_settings().db_path)
    with pytest.raises(Exception, match="viewer mode"):
        services.import_tuning_runs(store)
    assert store.list_runs() == []
    with pytest.raises(Exception, match="viewer mode"):
        ui.save_upload("p.jsonl", b'{"prompt": "x"}\n')
    assert not (fresh_data_dir / "uploads").exists()
    at = app_test(ui.PAGE_CONCURRENCY)
    at.selectbox(key="concurrency.source").set_value("jsonl").run()
    assert not at.exception and not at.get("file_uploader")
    assert any("viewer mode" in i.value for i in at.info)

    class Task:
        cancelled = False

        def cancel(self) -> None:
            self.cancelled = True

    task = Task()
    services.cancel(task)
    assert task.cancelled is False


# --- issue 45: what a new user saw that was not true (the CLI's side) ----------------------------


def test_tune_without_cuda_is_one_error_line(tmp_path: Path) -> None:
    from engines.accelerators import get_accelerator
    from tests.hostile.clirun import bench

    if get_accelerator("cuda").availability().ok:
        pytest.skip("CUDA is available here: tune would run")
    r = bench("tune", "--configs", "baseline", "--batches", "1", "--out", str(tmp_path / "t"), data_dir=tmp_path)
    assert r.returncode != 0
    assert r.one_error().startswith("error: accelerator 'cuda' is unavailable"), r.stderr


def test_runs_piped_into_head_exits_quietly(tmp_path: Path) -> None:
    """``bench runs | head`` printed "error: Broken pipe" and exited 2."""
    import subprocess
    import sys

    from tests.hostile.clirun import ROOT, cli_env

    store = Store(tmp_path / "db.sqlite")
    for i in range(400):  # more than a pipe's buffer of lines
        store.create_run(mode="latency", engine="native", model=f"m{i}", accelerator="cpu", config={})
    store.close()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "runs", "--db", str(tmp_path / "db.sqlite")],
        cwd=ROOT, env=cli_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()  # head read a line, then left
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 0 and err == "", err


def test_an_engine_that_cannot_start_here_stores_no_run(tmp_path: Path) -> None:
    """Each ``--engine vllm`` attempt without vLLM stored a failed run: refused before, in one line."""
    from bench.cli.common import refuse_unavailable_engine
    from tests.hostile.clirun import bench

    try:
        refuse_unavailable_engine({"kind": "vllm", "accelerator": "cpu"})
        pytest.skip("vLLM is installed here")
    except Exception:  # noqa: BLE001 - the reason is asserted through the CLI below
        pass
    db = str(tmp_path / "db.sqlite")
    for _ in range(2):
        r = bench("run", "--engine", "vllm", "--model", "tiny-deepseek-v3", "--requests", "2", "--db", db,
                  data_dir=tmp_path)  # fmt: skip
        assert r.returncode == 2
        assert r.one_error().startswith("error: engine 'vllm' is unavailable: vLLM is not installed"), r.stderr
    assert "no runs yet" in bench("runs", "--db", db, data_dir=tmp_path).stdout


def test_a_server_moebench_did_not_launch_has_no_hardware_limit(tmp_path: Path, server: Any) -> None:
    """An openai run against the zero-compute stub printed this CPU's bf16 "limit ... reached 6 %": a
    server MoE Bench only connected to (here, on localhost) computes on hardware it does not know."""
    from bench.metrics.run_limits import for_run_or_reason
    from tests.hostile.clirun import bench
    from tests.hostile.hostile_server import MODEL

    tiny = {"engine": {"model": "tiny-deepseek-v3", "accelerator": "cpu"}, "mode": "latency"}
    local = "http://127.0.0.1:8000/v1"
    assert for_run_or_reason(tiny, {"base_url": local}, None, measure=False) == (
        "a server MoE Bench did not launch (127.0.0.1): its hardware is unknown"
    )
    launched = for_run_or_reason(tiny, {"base_url": local, "managed": True, "host": "x"}, None, measure=False)
    assert isinstance(launched, str) and "another host" in launched  # the launched one keeps the CPU rules
    r = bench("run", "--engine", "openai", "--base-url", server.url(), "--model", MODEL, "--prompts", "builtin",
              "--requests", "2", "--warmup", "0", "--output-len", "4", "--quiet", "--db", str(tmp_path / "db.sqlite"),
              data_dir=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "note          no hardware limit: a server MoE Bench did not launch (127.0.0.1)" in r.stdout, r.stdout
    assert not any(line.startswith("limit ") for line in r.stdout.splitlines())


def test_the_readme_says_what_the_h100_energy_run_ran_at() -> None:
    """The README said the H100 energy example ran "at 16 in flight"; the stored run has concurrency 8."""
    import json

    from tests.hostile.clirun import ROOT

    run = json.loads((ROOT / "examples" / "h100-energy-concurrency-16.json").read_text(encoding="utf-8"))["run"]
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert run["concurrency"] == 8
    assert "2.76 J/token at 8 in flight" in readme and "at 16 in flight" not in readme
