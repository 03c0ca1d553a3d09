"""The embedded generator's settings, serialization and reply-cache keys (no model is loaded here)."""

from __future__ import annotations

import pytest
from haystack.dataclasses import ChatMessage

from haystack_fusion.backends.local import (
    LLAMA_LOG,
    LlamaCppChatGenerator,
    LlamaLog,
    LocalChatGenerator,
    TokenLogprob,
    _is_greedy,
    openai_logprobs,
    use_extra_buffer_types,
)

pytestmark = pytest.mark.skipif(LlamaCppChatGenerator is None, reason="the `local` extra is not installed")

PROMPT = [ChatMessage.from_user("Question: What is the capital of France?\nAnswer:")]


PORTABLE_BUILD = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | OPENMP = 1 | "
    "REPACK = 1 |"
)
"""The Makefile's x86-64-v3 build of llama-cpp-python 0.3.36."""
NATIVE_AMX_BUILD = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX_VNNI = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | "
    "AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |"
)
"""A native build (`GGML_NATIVE`) of the same version on an Intel Xeon with AMX."""


class TestLlamaLog:
    """llama.cpp's log lines: its errors on stderr, the rest only when asked for (`verbose`)."""

    @pytest.mark.parametrize(
        ("levels", "shown"),
        [
            ([1, 2, 3], [False, False, False]),  # debug, info, warning
            ([4, 5, 5], [True, True, True]),  # an error and its continued lines
            ([3, 5, 4, 2, 5], [False, False, True, False, False]),
        ],
    )
    def test_only_errors_by_default(self, levels, shown):
        log = LlamaLog()
        assert [log.shows(level) for level in levels] == shown

    def test_verbose_shows_every_line(self):
        log = LlamaLog(verbose=True)
        assert all(log.shows(level) for level in (1, 2, 3, 4, 5))

    def test_a_warning_goes_nowhere_and_an_error_to_stderr(self, capfd):
        log = LlamaLog()
        log.write(3, b"llama_kv_cache_iswa: using full-size SWA cache (ref: ...)\n")
        log.write(4, b"llama_model_load: error loading model\n")
        log.write(2, None)
        assert capfd.readouterr() == ("", "llama_model_load: error loading model\n")

    def test_llama_cpp_logs_through_it(self, capfd, monkeypatch):
        import ctypes

        import llama_cpp

        callback, data = llama_cpp.llama_log_callback(), ctypes.c_void_p()
        llama_cpp.llama_log_get(ctypes.byref(callback), ctypes.byref(data))
        monkeypatch.setattr(LLAMA_LOG, "verbose", False)
        callback(3, b"a warning\n", None)
        callback(4, b"an error\n", None)
        assert capfd.readouterr().err == "an error\n"

    def test_loading_a_verbose_model_turns_the_log_on(self, monkeypatch):
        import haystack_fusion.backends.local as local

        monkeypatch.setattr(local, "PrefixCachingLlama", lambda **kwargs: object())  # no model is loaded
        monkeypatch.setattr(local, "_LOADED", {})
        monkeypatch.setattr(LLAMA_LOG, "verbose", False)
        assert LocalChatGenerator().model_kwargs["verbose"] is False
        LocalChatGenerator(model="quiet.gguf").warm_up()
        assert LLAMA_LOG.verbose is False
        LocalChatGenerator(model="loud.gguf", model_kwargs={"verbose": True}).warm_up()
        assert LLAMA_LOG.verbose is True


class TestExtraBufferTypes:
    @pytest.mark.parametrize(
        ("system_info", "expected"),
        [
            (PORTABLE_BUILD, True),
            (NATIVE_AMX_BUILD, False),
            (NATIVE_AMX_BUILD.replace("AMX_INT8 = 1", "AMX_INT8 = 0"), True),
            ("CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |", True),
            ("CPU : AVX2 = 1 | AMX_TILE = 1 | AMX_BF16 = 1 |", False),
            ("Metal : EMBED_LIBRARY = 1 | CPU : AVX2 = 1 | AMX_INT8 = 1 |", False),
            ("", True),
        ],
        ids=["portable", "native-amx", "amx-off", "arm", "other-amx-features", "two-backends", "empty"],
    )
    def test_the_amx_kernels_are_never_taken(self, system_info, expected):
        assert use_extra_buffer_types(system_info) is expected

    def test_the_setting_can_be_given_and_reaches_the_model_parameters(self):
        generator = LocalChatGenerator(model_kwargs={"use_extra_bufts": False})
        assert generator.model_kwargs["use_extra_bufts"] is False
        data = generator.to_dict()
        assert LocalChatGenerator.from_dict(data).model_kwargs["use_extra_bufts"] is False


class TestLocalChatGenerator:
    def test_round_trip_keeps_the_cache_settings(self):
        generator = LocalChatGenerator(prefix_cache=False, reply_cache=False)
        data = generator.to_dict()
        assert data["init_parameters"]["prefix_cache"] is False
        assert data["init_parameters"]["reply_cache"] is False
        assert data["init_parameters"]["n_batch"] == 512
        assert LocalChatGenerator.from_dict(data).to_dict() == data

    def test_greedy_calls_have_a_cache_key(self):
        generator = LocalChatGenerator()
        key = generator._cache_key(PROMPT, None, {})
        assert key is not None
        assert key == LocalChatGenerator()._cache_key(PROMPT, None, {})  # shared by every generator
        assert generator._cache_key(PROMPT, {"max_tokens": 8}, {}) != key  # the settings are part of the key
        assert generator._cache_key("plain text prompt", None, {}) is not None

    @pytest.mark.parametrize(
        ("init", "generation_kwargs", "kwargs"),
        [
            ({}, {"temperature": 0.7}, {}),  # sampling
            ({}, None, {"streaming_callback": print}),  # streaming
            ({"reply_cache": False}, None, {}),
            ({"generation_kwargs": {"temperature": 0.8}}, None, {}),
        ],
    )
    def test_calls_that_are_never_cached(self, init, generation_kwargs, kwargs):
        assert LocalChatGenerator(**init)._cache_key(PROMPT, generation_kwargs, kwargs) is None

    def test_greedy(self):
        assert _is_greedy({"temperature": 0.0})
        assert _is_greedy({"temperature": 0.7, "top_k": 1})
        assert not _is_greedy({})  # llama-cpp-python's default temperature is 0.8
        assert not _is_greedy({"temperature": 0.2})


class TestLogprobs:
    def test_from_logits_is_the_log_softmax(self):
        import numpy as np

        logits = np.array([2.0, 1.0, 0.0, -1.0], dtype=np.float32)
        expected = logits - np.log(np.exp(logits).sum())
        step = TokenLogprob.from_logits(1, logits, top_logprobs=2)
        assert step.logprob == pytest.approx(float(expected[1]), abs=1e-6)
        assert [token for token, _ in step.top] == [0, 1]
        assert [lp for _, lp in step.top] == pytest.approx([float(expected[0]), float(expected[1])], abs=1e-6)
        assert TokenLogprob.from_logits(3, logits).top == ()

    def test_openai_shape_keeps_only_the_reply_tokens(self):
        pieces = {1: b" Par", 2: b"is", 3: b"\n\n", 4: b"Question"}
        trace = [TokenLogprob(1, -0.1, ((1, -0.1), (4, -3.0))), TokenLogprob(2, -0.2), TokenLogprob(3, -0.5)]
        shaped = openai_logprobs(trace, " Paris", lambda ids: b"".join(pieces[i] for i in ids))
        assert [entry["token"] for entry in shaped["content"]] == [" Par", "is"]
        assert shaped["content"][0]["top_logprobs"][1] == {
            "token": "Question",
            "logprob": -3.0,
            "bytes": list(b"Question"),
        }
        assert shaped["content"][1]["bytes"] == list(b"is")
        assert openai_logprobs(trace, "", lambda ids: b"x") == {"content": []}

    def test_default_settings_ask_for_logprobs_and_the_cache_key_keeps_them_apart(self):
        generator = LocalChatGenerator()
        assert generator.generation_kwargs["logprobs"] is True
        assert generator._cache_key(PROMPT, {"logprobs": False}, {}) != generator._cache_key(PROMPT, None, {})
