"""One settings object for the whole project; every default lives here.

Each field can be overridden by an environment variable ``MOEBENCH_<FIELD>``
(e.g. ``MOEBENCH_DB_PATH=/tmp/x.sqlite``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Settings:
    """Paths, ports and timeouts. Build with :func:`get_settings`."""

    data_dir: Path = PROJECT_ROOT / "data"
    db_path: Path = PROJECT_ROOT / "data" / "moebench.sqlite"
    model_cache_dir: Path = PROJECT_ROOT / "data" / "models"
    models_dir: Path = PROJECT_ROOT / "data" / "models"  # where real checkpoints are looked for
    # Managed servers' logs, beside the store they belong to (default: the db's folder, logs/).
    logs_dir: Path = PROJECT_ROOT / "data" / "logs"
    # The whole of one request, however the server trickles bytes (an engine's timeout_s
    # option overrides it per engine). Env: MOEBENCH_REQUEST_TIMEOUT_S.
    request_timeout_s: float = 600.0
    # Time allowed until a request's response headers arrive, and the longest silence while
    # its body streams. Env: MOEBENCH_FIRST_BYTE_TIMEOUT_S.
    first_byte_timeout_s: float = 300.0
    # Hosts that get the API key from the environment (OPENAI_API_KEY or
    # MOEBENCH_OPENAI_API_KEY), comma-separated (`*`: any host); any other base URL is sent no key.
    # Env: MOEBENCH_API_KEY_HOSTS.
    api_key_hosts: str = "api.openai.com,127.0.0.1,localhost"
    server_start_timeout_s: float = 300.0
    sample_interval_s: float = 1.0
    host: str = "127.0.0.1"
    # Interpreter of the environment that has vLLM (empty: .venv-vllm/bin/python when it
    # exists, else the current interpreter). Env: MOEBENCH_VLLM_PYTHON.
    vllm_python: str = ""
    # Host names the dashboard answers to, comma-separated, any port (DNS-rebinding guard,
    # dashboard/host_guard.py); a LAN demo adds the machine's name or address, `*` turns the
    # check off. Env: MOEBENCH_ALLOWED_HOSTS.
    allowed_hosts: str = "127.0.0.1,localhost,::1"
    # The dashboard's shared secret: when set, every request needs it (a cookie set once by
    # opening the page with ?token=SECRET or through the login form); required to serve beyond
    # loopback. Env: MOEBENCH_ACCESS_TOKEN, or MOEBENCH_ACCESS_TOKEN_FILE (a file holding it).
    access_token: str = ""
    access_token_file: str = ""
    # "operator" (default) or "viewer": a read-only dashboard for demos (`make demo`): every page
    # readable, nothing can be loaded, started, stopped, imported or deleted. Env: MOEBENCH_MODE.
    mode: str = "operator"
    # Where the dashboard runs an engine whose model computes in-process (native): "process"
    # (default: an engine host child process, bench/run/engine_host.py, so chart drawing never
    # shares the model's GIL) or "inline" (in the dashboard process). Env: MOEBENCH_MODEL_HOST.
    model_host: str = "process"
    # "on" (default): a run collects and freezes the measuring process's heap when its clock
    # starts (bench/run/gc_watch.py); "off": it does not (GC pauses are timed either way), to see
    # what the freeze changes. Env: MOEBENCH_GC_FREEZE.
    gc_freeze: str = "on"
    # "on": the CLI names the threads still alive when it exits (a C++ abort's suspects: an H100 run
    # aborted with the run's worker still inside CUDA). Env: MOEBENCH_EXIT_THREADS.
    exit_threads: str = "off"
    # "realtime": a sender process (HTTP engines) asks for the round-robin real-time class (SCHED_RR,
    # priority 1) where the OS allows it (root, or CAP_SYS_NICE), so it reads each chunk when it
    # arrives even beside a server that spins on every core (bench/send/cpu_wait.py); "normal": it
    # does not. Either way a run whose sending loop waited for a CPU says so.
    # Env: MOEBENCH_SENDER_PRIORITY.
    sender_priority: str = "realtime"
    # Rental prices per accelerator-hour (US dollars) that override the defaults of
    # bench/metrics/cost.py (each with its source there), as CARD=DOLLARS pairs: "h100=2.5,h200=3.2"
    # (cards: h100, h200, ascend-910b, mlu590, cpu, or a kind such as cuda for an unnamed device).
    # Env: MOEBENCH_ACCELERATOR_PRICES.
    accelerator_prices: str = ""

    def dashboard_secret(self) -> str | None:
        """The dashboard's access token: the variable, else the first line of the file; None when unset.
        A file that cannot be read raises ValueError (one line): a secret asked for is never silently off."""
        if self.access_token.strip():
            return self.access_token.strip()
        if not self.access_token_file:
            return None
        try:
            text = Path(self.access_token_file).read_text(encoding="utf-8").strip().splitlines()
        except OSError as exc:
            raise ValueError(f"MOEBENCH_ACCESS_TOKEN_FILE {self.access_token_file}: {exc.strerror or exc}") from exc
        if not text or not text[0].strip():
            raise ValueError(f"MOEBENCH_ACCESS_TOKEN_FILE {self.access_token_file} is empty")
        return text[0].strip()

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Settings:
        """Defaults, overridden by ``MOEBENCH_*`` variables."""
        env = os.environ if environ is None else environ
        base = cls()
        data_dir = Path(env.get("MOEBENCH_DATA_DIR", base.data_dir))
        values: dict[str, object] = {
            "data_dir": data_dir,
            "db_path": data_dir / "moebench.sqlite",
            "model_cache_dir": data_dir / "models",
            "models_dir": data_dir / "models",
        }
        for f in fields(cls):
            raw = env.get(f"MOEBENCH_{f.name.upper()}")
            if raw is None:
                continue
            current = getattr(base, f.name)
            if isinstance(current, Path):
                values[f.name] = Path(raw)
            elif isinstance(current, float):
                values[f.name] = float(raw)
            else:
                values[f.name] = raw
        if "MOEBENCH_LOGS_DIR" not in env:
            # Logs follow the store: a db elsewhere keeps its servers' logs beside it.
            values["logs_dir"] = Path(values.get("db_path", base.db_path)).parent / "logs"  # type: ignore[arg-type]
        return replace(base, **values)


def get_settings() -> Settings:
    """The settings in force now (read from the environment on each call)."""
    return Settings.from_env()
