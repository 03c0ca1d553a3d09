"""
`haystack-fusion serve` (the documented way to serve) in a child process on 127.0.0.1: for serving tests and load
runs.

It starts the server with the environment it is given (the backend's variables, `HAYSTACK_FUSION_API_KEY`, ...),
waits until `GET /status` answers (the app loads every strategy before it listens), and stops the process (terminate,
then kill after 10 s) when done. `rss_bytes` reads the process's resident memory from `/proc` (Linux). It needs the
`serve` extra in the environment it runs in.

### Usage example
```python
from tests.support.serve_process import HayhooksProcess

env = {"HAYSTACK_FUSION_LLM": "openai", "OPENAI_API_KEY": "x", "OPENAI_BASE_URL": server.base_url, ...}
with HayhooksProcess(["concat_pf"], env=env, workdir=tmp_path) as hayhooks:
    print(hayhooks.url, hayhooks.rss_bytes())
```
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (closed again: nothing listens there until someone binds it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class HayhooksProcess:
    """
    `haystack-fusion serve` with `strategies`, in a child process.

    :param strategies: The strategies to serve (`--strategy`).
    :param env: Variables added to the current environment (`HAYSTACK_DESERIALIZATION_ALLOWLIST` and
        `HAYSTACK_TELEMETRY_ENABLED` are set for you).
    :param workdir: The server's working folder, where its log goes (`server.log`).
    :param startup_seconds: How long to wait for the server to answer.
    :param args: More arguments of `haystack-fusion serve` (`--with-chainlit`, `--mcp`).
    """

    def __init__(
        self,
        strategies: list[str],
        *,
        env: Mapping[str, str],
        workdir: Path,
        startup_seconds: float = 240.0,
        args: tuple[str, ...] = (),
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
        self.args = args
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

    def _up(self) -> bool:
        try:
            return httpx.get(f"{self.url}/status", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def start(self) -> HayhooksProcess:
        """
        Start the server and wait until it answers.

        :raises RuntimeError: With the log's tail, if the process exits or `startup_seconds` pass first.
        """
        command = [str(Path(sys.executable).with_name("haystack-fusion")), "serve", "--port", str(self.port)]
        command += [argument for strategy in self.strategies for argument in ("--strategy", strategy)]
        command += list(self.args)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command, env=self.env, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + self.startup_seconds
        while time.monotonic() < deadline:
            if self._up():
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"haystack-fusion serve exited: {self.log()[-3000:]}")
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"haystack-fusion serve was not up after {self.startup_seconds} s: {self.log()[-3000:]}")

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
