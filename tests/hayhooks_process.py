"""
A `hayhooks run` server in a child process on 127.0.0.1, serving some of the shipped wrappers: for the serving tests
and `benchmarks/load.py`.

It copies the named wrappers from `pipelines/` to a folder of its own, starts Hayhooks with the environment it is
given (the backend's variables), waits until `GET /status` lists them, and stops the process (terminate, then kill
after 10 s) when done. `rss_bytes` reads the process's resident memory from `/proc` (Linux).

### Usage
```python
from tests.hayhooks_process import HayhooksProcess

env = {"HAYSTACK_FUSION_LLM": "openai", "OPENAI_API_KEY": "x", "OPENAI_BASE_URL": server.base_url, ...}
with HayhooksProcess(["concat_pf"], env=env, workdir=tmp_path) as hayhooks:
    print(hayhooks.url, hayhooks.rss_bytes())
```
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

WRAPPERS = Path(__file__).resolve().parents[1] / "pipelines"


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (closed again: nothing listens there until someone binds it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class HayhooksProcess:
    """
    `hayhooks run` with the wrappers of `strategies`, in a child process.

    :param strategies: Wrapper folders of `pipelines/` to deploy.
    :param env: Variables added to the current environment (`HAYSTACK_DESERIALIZATION_ALLOWLIST` and
        `HAYSTACK_TELEMETRY_ENABLED` are set for you).
    :param workdir: A folder for the wrappers' copy and the server's log (`server.log`).
    :param startup_seconds: How long to wait for the wrappers to deploy.
    :param expect_deployed: Wait until `GET /status` lists every wrapper (False: until Hayhooks logs that its startup
        deploy is complete, for wrappers expected to refuse).
    """

    def __init__(
        self,
        strategies: list[str],
        *,
        env: Mapping[str, str],
        workdir: Path,
        startup_seconds: float = 240.0,
        expect_deployed: bool = True,
    ) -> None:
        self.strategies = strategies
        self.env = {
            **os.environ,
            "HAYSTACK_DESERIALIZATION_ALLOWLIST": "haystack_fusion",
            "HAYSTACK_TELEMETRY_ENABLED": "False",
            **env,
        }
        self.workdir = Path(workdir)
        self.startup_seconds = startup_seconds
        self.expect_deployed = expect_deployed
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.workdir / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    def log(self) -> str:
        """The server's output so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def rss_bytes(self) -> int:
        """The server process's resident set size now, in bytes (`VmRSS` in `/proc/<pid>/status`)."""
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS line")

    def _deployed(self) -> bool:
        try:
            names = set(httpx.get(f"{self.url}/status", timeout=2).json()["pipelines"])
        except (httpx.HTTPError, ValueError, KeyError):
            return False
        return set(self.strategies) <= names

    def start(self) -> HayhooksProcess:
        """
        Start the server and wait for the wrappers (or, without `expect_deployed`, for Hayhooks' startup to end).

        :raises RuntimeError: With the log's tail, if the process exits or `startup_seconds` pass first.
        """
        pipelines = self.workdir / "pipelines"
        for strategy in self.strategies:
            shutil.copytree(WRAPPERS / strategy, pipelines / strategy, dirs_exist_ok=True)
        hayhooks = Path(sys.executable).with_name("hayhooks")
        command = [str(hayhooks), "run", "--host", "127.0.0.1", "--port", str(self.port)]
        command += ["--pipelines-dir", str(pipelines)]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_seconds
        while time.monotonic() < deadline:
            if self.expect_deployed and self._deployed():
                return self
            if not self.expect_deployed and "Startup deploy complete" in self.log():
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"hayhooks exited: {self.log()[-3000:]}")
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"hayhooks was not ready after {self.startup_seconds} s: {self.log()[-3000:]}")

    def stop(self) -> None:
        """Terminate the server (kill it after 10 s); safe to call more than once."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> HayhooksProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
