"""The DNS-rebinding guard: the allow-list functions, the middleware, and the real server.

The server tests start the dashboard as ``make run`` does (``streamlit run dashboard/serve.py``)
and talk to it over real sockets: a foreign ``Host`` gets 403 on HTTP, and a WebSocket
handshake with a foreign Host or Origin is refused, while the app's own ones are accepted.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient, WebSocketDenialResponse
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from dashboard.host_guard import (
    HostGuardMiddleware,
    host_allowed,
    host_name,
    origin_allowed,
    parse_allowed_hosts,
)
from engines.settings import Settings
from tests.dashboard.conftest import ROOT, SERVE, free_port, running_dashboard

DEFAULT = parse_allowed_hosts(Settings().allowed_hosts)
STREAM = "/_stcore/stream"  # Streamlit's WebSocket endpoint


# --- the pure allow-list functions ------------------------------------------------------


def test_the_default_allows_loopback_names_only() -> None:
    assert DEFAULT == {"127.0.0.1", "localhost", "::1"}


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "127.0.0.1:8501", "localhost:1", "LOCALHOST:8501", "LocalHost", "localhost.:8501", "[::1]:8501"],
)
def test_loopback_hosts_on_any_port_are_allowed(host: str) -> None:
    assert host_allowed(host, DEFAULT)


@pytest.mark.parametrize(
    "host",
    [
        None,
        "",
        " ",
        "evil.example",
        "evil.example:8501",
        "localhost.evil.example:8501",
        "127.0.0.1.nip.io:8501",
        "[::2]:8501",
        "::1",  # an IPv6 Host must be bracketed
        "localhost:abc",
        "localhost:99999",
        "user@localhost:8501",
        "localhost/path",
        "localhost:8501?q",
    ],
)
def test_foreign_empty_or_malformed_hosts_are_refused(host: str | None) -> None:
    assert not host_allowed(host, DEFAULT)


def test_host_name_drops_the_port_brackets_case_and_trailing_dot() -> None:
    assert host_name("[::1]:8501") == "::1"
    assert host_name("Bench.LAN.:80") == "bench.lan"
    assert host_name("") is None


def test_the_allow_list_parses_loosely_and_refuses_to_be_empty() -> None:
    assert parse_allowed_hosts(" 127.0.0.1 , LOCALHOST,[::1],, bench.lan. ") == {
        "127.0.0.1",
        "localhost",
        "::1",
        "bench.lan",
    }
    with pytest.raises(ValueError, match="MOEBENCH_ALLOWED_HOSTS"):
        parse_allowed_hosts(" , ")


def test_star_turns_the_check_off() -> None:
    anyone = parse_allowed_hosts("*")
    assert host_allowed("evil.example:8501", anyone)
    assert origin_allowed("http://evil.example", anyone)


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        (None, True),  # non-browser client
        ("http://127.0.0.1:8501", True),
        ("https://localhost", True),
        ("http://[::1]:8501", True),
        ("http://evil.example:8501", False),
        ("http://127.0.0.1.evil.example", False),
        ("null", False),
        ("file://", False),
        ("chrome-extension://localhost", False),
        ("http://localhost:notaport", False),
    ],
)
def test_websocket_origins(origin: str | None, allowed: bool) -> None:
    assert origin_allowed(origin, DEFAULT) is allowed


# --- the middleware, configured through the setting ------------------------------------


async def _home(request: object) -> PlainTextResponse:
    return PlainTextResponse("home")


async def _echo(websocket: WebSocket) -> None:
    await websocket.accept()
    await websocket.send_text("hi")
    await websocket.close()


def _guarded(allowed_hosts: str) -> TestClient:
    app = Starlette(
        routes=[Route("/", _home), WebSocketRoute("/ws", _echo)],
        middleware=[Middleware(HostGuardMiddleware, allowed_hosts=allowed_hosts)],
    )
    return TestClient(app)


def test_a_lan_name_from_the_setting_is_served_and_loopback_then_is_not() -> None:
    settings = Settings.from_env({"MOEBENCH_ALLOWED_HOSTS": "bench.lan"})
    client = _guarded(settings.allowed_hosts)
    assert client.get("/", headers={"Host": "bench.lan:8501"}).text == "home"
    refused = client.get("/", headers={"Host": "127.0.0.1:8501"})
    assert refused.status_code == 403
    assert refused.headers["content-type"].startswith("text/plain")
    assert refused.text.count("\n") == 1 and "MOEBENCH_ALLOWED_HOSTS" in refused.text
    with client.websocket_connect("/ws", headers={"Host": "bench.lan", "Origin": "http://bench.lan:8501"}) as ws:
        assert ws.receive_text() == "hi"
    with (
        pytest.raises(WebSocketDisconnect),
        client.websocket_connect("/ws", headers={"Host": "bench.lan", "Origin": "http://evil.example"}),
    ):
        pass


def test_star_serves_any_host_and_says_so_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("dashboard.host_guard")
    logger.addHandler(caplog.handler)  # Streamlit's loggers do not propagate to the root
    try:
        # Starlette builds its middleware on the first request (st.App: at server start).
        assert _guarded("*").get("/", headers={"Host": "evil.example"}).text == "home"
    finally:
        logger.removeHandler(caplog.handler)
    assert "check is off" in caplog.text


def test_two_host_headers_are_refused() -> None:
    client = _guarded("127.0.0.1,localhost")
    response = client.get("/", headers=[("Host", "127.0.0.1"), ("Host", "evil.example")])
    assert response.status_code == 403


# --- the real dashboard ------------------------------------------------------------------


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The dashboard started as `make run` starts it, with the default allow-list."""
    folder = tmp_path_factory.mktemp("host_guard")
    env = {k: v for k, v in os.environ.items() if k != "MOEBENCH_ALLOWED_HOSTS"}
    env.update({"MOEBENCH_DATA_DIR": str(folder / "data"), "PYTHONUNBUFFERED": "1"})
    with running_dashboard(env, folder / "streamlit.log") as url:
        yield url


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _handshake(url: str, host: str, origin: str) -> int:
    """The status of a WebSocket handshake on Streamlit's stream, sent with this Host and Origin.

    The socket is connected to the server itself; ``host`` only fills the Host header, as a
    browser does after DNS rebinding.
    """

    async def attempt() -> int:
        with socket.create_connection(("127.0.0.1", _port(url)), timeout=10) as sock:
            try:
                async with connect(
                    f"ws://{host}{STREAM}", sock=sock, origin=origin, subprotocols=["streamlit"], open_timeout=10
                ):
                    return 101
            except InvalidStatus as exc:
                return exc.response.status_code

    return asyncio.run(attempt())


def test_http_with_the_apps_own_host_is_served(dashboard: str) -> None:
    response = httpx.get(f"{dashboard}/", headers={"Host": f"127.0.0.1:{_port(dashboard)}"})
    assert response.status_code == 200
    assert "<html" in response.text.lower()


def test_http_with_a_foreign_host_is_forbidden(dashboard: str) -> None:
    for path in ("/", "/_stcore/health"):
        response = httpx.get(f"{dashboard}{path}", headers={"Host": f"evil.example:{_port(dashboard)}"})
        assert response.status_code == 403, path
        assert "MOEBENCH_ALLOWED_HOSTS" in response.text


def test_websocket_with_the_apps_own_host_and_origin_is_accepted(dashboard: str) -> None:
    port = _port(dashboard)
    assert _handshake(dashboard, f"127.0.0.1:{port}", f"http://127.0.0.1:{port}") == 101
    assert _handshake(dashboard, f"localhost:{port}", f"http://localhost:{port}") == 101


def test_websocket_after_dns_rebinding_is_refused(dashboard: str) -> None:
    port = _port(dashboard)
    assert _handshake(dashboard, f"evil.example:{port}", f"http://evil.example:{port}") == 403


def test_websocket_from_a_foreign_page_is_refused(dashboard: str) -> None:
    port = _port(dashboard)
    assert _handshake(dashboard, f"127.0.0.1:{port}", f"http://evil.example:{port}") == 403


def test_refusals_are_logged(dashboard: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    httpx.get(f"{dashboard}/", headers={"Host": "rebound.example"})
    log = Path(tmp_path_factory.getbasetemp()).glob("host_guard*/streamlit.log")
    assert any("Refused http /: Host 'rebound.example'" in p.read_text() for p in log)


# --- the access token ---------------------------------------------------------------------


def _tokened(secret: str) -> TestClient:
    app = Starlette(
        routes=[Route("/", _home), Route("/_stcore/health", _home), WebSocketRoute("/ws", _echo)],
        middleware=[Middleware(HostGuardMiddleware, allowed_hosts="127.0.0.1", token=secret)],
    )
    return TestClient(app, base_url="http://127.0.0.1:8501")


def test_with_a_token_every_request_needs_it() -> None:
    client = _tokened("s3cret-token")
    refused = client.get("/")
    assert refused.status_code == 401 and 'name="token"' in refused.text  # the login form
    assert client.get("/?token=wrong").status_code == 401
    assert client.get("/_stcore/health").status_code == 200  # liveness only
    with (
        pytest.raises((WebSocketDisconnect, WebSocketDenialResponse)),
        client.websocket_connect("/ws", headers={"Host": "127.0.0.1", "Origin": "http://127.0.0.1"}),
    ):
        pass
    signed = client.get("/?token=s3cret-token&x=1", follow_redirects=False)
    assert signed.status_code == 303 and signed.headers["location"] == "/?x=1"  # the token leaves the URL
    cookie = signed.headers["set-cookie"]
    assert "moebench_access=s3cret-token" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert client.get("/").text == "home"  # the client keeps the cookie
    # (the test client sends no cookies on a WebSocket: the browser test below shows a real one does)
    with client.websocket_connect(
        "/ws", headers={"Host": "127.0.0.1", "Origin": "http://127.0.0.1", "Cookie": "moebench_access=s3cret-token"}
    ) as ws:
        assert ws.receive_text() == "hi"
    stranger = _tokened("s3cret-token")
    stranger.cookies.set("moebench_access", "guess")
    assert stranger.get("/").status_code == 401


def _serve(env_extra: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MOEBENCH_DATA_DIR": str(tmp_path / "data"), **env_extra}
    argv = [sys.executable, "-m", "streamlit", "run", str(SERVE), "--server.port", str(free_port()),
            "--server.headless", "true"]  # fmt: skip
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_serving_beyond_loopback_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    r = _serve({"STREAMLIT_SERVER_ADDRESS": "0.0.0.0"}, tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert lines == [
        "error: the dashboard would listen on 0.0.0.0, beyond this machine, without an access token: set "
        "MOEBENCH_ACCESS_TOKEN (or MOEBENCH_ACCESS_TOKEN_FILE), or serve on 127.0.0.1"
    ], r.stderr
    missing = _serve({"MOEBENCH_ACCESS_TOKEN_FILE": str(tmp_path / "nope")}, tmp_path)
    assert missing.returncode == 2 and "MOEBENCH_ACCESS_TOKEN_FILE" in missing.stderr


def test_app_py_run_directly_serves_nothing(fresh_data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamlit.testing.v1 import AppTest

    monkeypatch.delenv("MOEBENCH_GUARDED", raising=False)
    at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=60)
    at.run()
    assert not at.exception
    assert len(at.error) == 1 and at.error[0].value.startswith("Start the dashboard with `make run`")
    assert not at.sidebar.markdown  # nothing else was drawn


def test_chromium_signs_in_with_the_token_on_a_lan_address(tmp_path: Path) -> None:
    """The dashboard on 0.0.0.0 with a token: a request without it gets 401 (HTTP and the
    WebSocket), Chromium signs in through the form and the app works (its sidebar loads)."""
    from playwright.sync_api import sync_playwright

    from tests.dashboard.test_e2e_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (make browser installs it)")
    env = {**os.environ, "MOEBENCH_DATA_DIR": str(tmp_path / "data"), "MOEBENCH_ACCESS_TOKEN": "lan-demo-7f3a",
           "STREAMLIT_SERVER_ADDRESS": "0.0.0.0", "PYTHONUNBUFFERED": "1"}  # fmt: skip
    with running_dashboard(env, tmp_path / "streamlit.log") as url:
        port = _port(url)
        assert httpx.get(f"{url}/").status_code == 401
        assert _handshake(url, f"127.0.0.1:{port}", f"http://127.0.0.1:{port}") == 403
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page()
            page.goto(url)
            page.fill('input[name="token"]', "lan-demo-7f3a")
            page.click('button[type="submit"]')
            page.locator('[data-testid="stSidebarNav"]').wait_for(timeout=60_000)
            assert "token=" not in page.url
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "signed-in.png"))
            browser.close()
