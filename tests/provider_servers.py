"""Model servers for provider tests: llama.cpp's ``llama-server`` with the tiny tool-calling
model from ``../shared`` (skipped with the reason when it is absent, as in a fresh clone)
and the project's own fault-injecting server (tests/fault_server.py).

Import the fixtures into a test module: ``from tests.provider_servers import llama, faults``.
One llama-server per test session and file worker, on a free loopback port, two threads (the
CI machine's cores are shared)."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.ports import free_port
from tests.fault_server import FaultServer
from tests.redis_server import REPO_ROOT

MODEL_ALIAS = "tiny-tool"


def shared_dir(tool: str = "llama-server/llama-server") -> Path | None:
    """``shared/`` next to the repository or to the folder holding it (worktrees), where it
    holds ``tools/<tool>``."""
    given = os.environ.get("ROBOT_LAB_TEST_SHARED_DIR")
    if given:
        return Path(given)
    for base in (REPO_ROOT.parent, REPO_ROOT.parent.parent):
        if (base / "shared" / "tools" / tool).exists():
            return base / "shared"
    return None


@dataclass
class LlamaServer:
    base_url: str  # OpenAI-compatible: http://127.0.0.1:PORT/v1
    model: str = f"openai/{MODEL_ALIAS}"
    process: subprocess.Popen | None = None  # type: ignore[type-arg]

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1].split("/")[0])


def start_llama_server(shared: Path, log_path: Path) -> LlamaServer:
    binary = shared / "tools" / "llama-server" / "llama-server"
    model = shared / "models" / "tiny-tool.gguf"
    port = free_port()
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "8192", "-np", "4",
         "-t", "2", "--jinja", "--alias", MODEL_ALIAS, "-n", "256"],
        stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return LlamaServer(base_url=f"http://127.0.0.1:{port}/v1", process=proc)
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("llama-server did not become healthy within 30 s")


@pytest.fixture(scope="session")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """A real llama-server serving tiny-tool.gguf (skips when ../shared/tools is absent)."""
    shared = shared_dir()
    if shared is None or not (shared / "models" / "tiny-tool.gguf").exists() or not (
            shared / "tools" / "llama-server" / "llama-server").exists():
        pytest.skip("llama-server or tiny-tool.gguf not found in ../shared (tools/, models/); "
                    "set ROBOT_LAB_TEST_SHARED_DIR to run the real-provider tests")
    server = start_llama_server(shared, tmp_path_factory.mktemp("llama") / "server.log")
    try:
        yield server
    finally:
        assert server.process is not None
        server.process.terminate()
        try:
            server.process.wait(10)
        except subprocess.TimeoutExpired:
            server.process.kill()


@pytest.fixture(scope="module")
def faults() -> Iterator[FaultServer]:
    server = FaultServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def model_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Model requests on (the suite forbids them); they only reach loopback servers here."""
    monkeypatch.setenv("ROBOT_LAB_ALLOW_MODEL_REQUESTS", "1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
