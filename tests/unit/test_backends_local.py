"""The embedded generator's settings, serialization, log-probabilities and llama.cpp log (no model is loaded here)."""

from __future__ import annotations

import copy

import pytest

from haystack_fusion.backends import LOCAL_GENERATION_KWARGS, pinned
from haystack_fusion.backends.local import (
    LLAMA_LOG,
    LlamaLog,
    LocalChatGenerator,
    LogprobRecorder,
    _is_greedy,
    use_extra_buffer_types,
)

pytestmark = pytest.mark.skipif(LocalChatGenerator is None, reason="the `local` extra is not installed")

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

        monkeypatch.setattr(local.llama_cpp, "Llama", lambda **kwargs: object())  # no model is loaded
        monkeypatch.setattr(local, "_LOADED", {})
        monkeypatch.setattr(LLAMA_LOG, "verbose", False)
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
    def test_to_dict(self):
        generator = LocalChatGenerator(prefix_cache=False, reply_cache=False, streaming_callback=print)
        data = generator.to_dict()
        assert data == {
            "type": "haystack_fusion.backends.local.LocalChatGenerator",
            "init_parameters": {
                "model": None,
                "n_ctx": 8192,
                "n_batch": 512,
                "model_kwargs": {},
                "generation_kwargs": LOCAL_GENERATION_KWARGS,
                "streaming_callback": "builtins.print",
                "prefix_cache": False,
                "reply_cache": False,
            },
        }
        assert LocalChatGenerator.from_dict(copy.deepcopy(data)).to_dict() == data

    def test_no_messages_no_reply(self):
        assert LocalChatGenerator().run([]) == {"replies": []}  # nothing is loaded

    def test_greedy(self):
        assert _is_greedy({"temperature": 0.0})
        assert _is_greedy({"temperature": 0.7, "top_k": 1})
        assert not _is_greedy({})  # llama-cpp-python's default temperature is 0.8
        assert not _is_greedy({"temperature": 0.2})


PIECES = {0: b" Par", 1: b"is", 2: b"\n\n", 3: b"Question"}


class TestLogprobs:
    def detokenize(self, ids):
        return b"".join(PIECES[i] for i in ids)

    def test_a_step_is_the_log_softmax(self):
        import numpy as np

        logits = np.array([2.0, 1.0, 0.0, -1.0], dtype=np.float32)
        expected = logits - np.log(np.exp(logits).sum())
        token, logprob, top = LogprobRecorder(top_logprobs=2).step(1, logits)
        assert token == 1
        assert logprob == pytest.approx(float(expected[1]), abs=1e-6)
        assert [t for t, _ in top] == [0, 1]
        assert [lp for _, lp in top] == pytest.approx([float(expected[0]), float(expected[1])], abs=1e-6)
        assert LogprobRecorder().step(3, logits)[2] == []

    def test_each_row_goes_with_the_token_chosen_from_it(self):
        import numpy as np

        rows = [np.array([3.0, 1.0, 0.0, 0.0], dtype=np.float32), np.array([0.0, 2.0, 1.0, 0.0], dtype=np.float32)]
        recorder = LogprobRecorder(top_logprobs=1)
        assert recorder([5, 6], rows[0]) is rows[0]  # the logits are returned as they are
        recorder([5, 6, 0], rows[1])  # token 0 was chosen from the first row
        assert recorder.steps == [recorder.step(0, rows[0])]
        assert [entry["token"] for entry in recorder.openai(" Par", self.detokenize)["content"]] == [" Par"]
        # cut at max_tokens: the last row's token is the one that ends the reply
        shaped = recorder.openai(" Paris", self.detokenize)["content"]
        assert [entry["token"] for entry in shaped] == [" Par", "is"]
        assert shaped[1]["logprob"] == recorder.step(1, rows[1])[1]

    def test_openai_shape_keeps_only_the_reply_tokens(self):
        recorder = LogprobRecorder()
        recorder.steps = [(0, -0.1, [(0, -0.1), (3, -3.0)]), (1, -0.2, []), (2, -0.5, [])]
        shaped = recorder.openai(" Paris", self.detokenize)
        assert [entry["token"] for entry in shaped["content"]] == [" Par", "is"]
        assert shaped["content"][0]["top_logprobs"][1] == {
            "token": "Question",
            "logprob": -3.0,
            "bytes": list(b"Question"),
        }
        assert shaped["content"][1]["bytes"] == list(b"is")
        assert recorder.openai("", self.detokenize) == {"content": []}

    def test_default_settings_ask_for_logprobs(self):
        assert LocalChatGenerator().generation_kwargs["logprobs"] is True


def test_pinned_llama_cpp_version():
    """`backends.pinned` uses llama-cpp-python internals tested on one version: another must be checked first."""
    import llama_cpp

    assert llama_cpp.__version__ == pinned.LLAMA_CPP_VERSION


def test_the_pinned_uses_refuse_another_version(monkeypatch):
    import llama_cpp

    monkeypatch.setattr(llama_cpp, "__version__", "0.0.1")
    with pytest.raises(
        pinned.PinnedVersionError,
        match=r"llama-cpp-python 0\.3\.36, and 0\.0\.1 is installed: install llama-cpp-python==0\.3\.36 ",
    ):
        pinned.reuse_prefix(object(), [1, 2], 512)
