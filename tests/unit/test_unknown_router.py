import pytest
from haystack import Document, Pipeline
from haystack.core.serialization import component_from_dict, component_to_dict
from haystack.dataclasses import ChatMessage

from haystack_fusion import UnknownRouter
from haystack_fusion.prompts import COT_ANSWER_PATTERN, PROMPTS


def _to_dict(router):
    return component_to_dict(router, "router")


def _from_dict(data):
    return component_from_dict(UnknownRouter, data, "router")


DOCUMENTS = [Document(content="Paris is the capital of France."), Document(content="Lyon is in France.")]


def reply_with_logprobs(text: str, logprobs: list[float]) -> ChatMessage:
    tokens = [{"token": f"t{i}", "logprob": logprob} for i, logprob in enumerate(logprobs)]
    return ChatMessage.from_assistant(text, meta={"logprobs": {"content": tokens}})


class TestUnknownRouter:
    def test_known_reply(self):
        replies = [ChatMessage.from_assistant("Paris")]
        result = UnknownRouter().run(replies=replies, query="What is the capital of France?", documents=DOCUMENTS)
        assert result == {"known": replies}

    @pytest.mark.parametrize(
        "text",
        [
            "unknown",
            "Unknown.",
            " unknown\nbecause the context says nothing",
            "I don't know",
            "",
            'The answer is "unknown".',
            "Answer: **unknown**",
        ],
    )
    def test_unknown_reply_passes_fallback_inputs(self, text):
        replies = [ChatMessage.from_assistant(text)]
        result = UnknownRouter().run(replies=replies, query="What is the capital of France?", documents=DOCUMENTS)
        assert result == {
            "unknown": replies,
            "reason": "unknown answer",
            "fallback_query": "What is the capital of France?",
            "fallback_documents": DOCUMENTS,
        }

    def test_unknown_without_query_and_documents(self):
        replies = [ChatMessage.from_assistant("unknown")]
        assert UnknownRouter().run(replies=replies) == {"unknown": replies, "reason": "unknown answer"}

    def test_empty_documents_are_passed_on(self):
        replies = [ChatMessage.from_assistant("unknown")]
        result = UnknownRouter().run(replies=replies, query="Q?", documents=[])
        assert result == {
            "unknown": replies,
            "reason": "unknown answer",
            "fallback_query": "Q?",
            "fallback_documents": [],
        }

    def test_empty_replies_are_unknown(self):
        result = UnknownRouter().run(replies=[], query="Q?", documents=DOCUMENTS)
        assert result == {"unknown": [], "reason": "no reply", "fallback_query": "Q?", "fallback_documents": DOCUMENTS}

    def test_only_first_reply_is_judged(self):
        replies = [ChatMessage.from_assistant("Paris"), ChatMessage.from_assistant("unknown")]
        assert UnknownRouter().run(replies=replies) == {"known": replies[:1]}  # the judged reply, not the others
        replies = [ChatMessage.from_assistant("unknown"), ChatMessage.from_assistant("Paris")]
        assert set(UnknownRouter().run(replies=replies)) == {"unknown", "reason"}

    def test_first_line_answer_pattern(self):
        # The Figure 7 pattern reads the first line only.
        replies = [ChatMessage.from_assistant("Unknown Pleasures\nI don't know more")]
        assert set(UnknownRouter().run(replies=replies)) == {"known"}

    @pytest.mark.parametrize("text", ["Unknown Pleasures", "The answer is Unknown Pleasures.", "the unknown soldier"])
    def test_answer_holding_unknown_is_known(self, text):
        assert set(UnknownRouter().run(replies=[ChatMessage.from_assistant(text)])) == {"known"}

    def test_answer_pattern_none_judges_whole_reply(self):
        router = UnknownRouter(answer_pattern=None)
        assert set(router.run(replies=[ChatMessage.from_assistant("Paris\nI don't know")])) == {"unknown", "reason"}
        assert set(router.run(replies=[ChatMessage.from_assistant(" Paris ")])) == {"known"}

    def test_cot_answer_pattern(self):
        router = UnknownRouter(answer_pattern=COT_ANSWER_PATTERN)
        assert set(router.run(replies=[ChatMessage.from_assistant("Sources...\nAnswer: Saw VI")])) == {"known"}
        assert set(router.run(replies=[ChatMessage.from_assistant("Sources...\nAnswer: unknown")])) == {
            "unknown",
            "reason",
        }
        # No "Answer:" line: an empty answer, which is unknown.
        assert set(router.run(replies=[ChatMessage.from_assistant("It is Saw VI.")])) == {"unknown", "reason"}

    def test_custom_unknown_patterns(self):
        router = UnknownRouter(unknown_patterns=[r"^no idea$"])
        assert set(router.run(replies=[ChatMessage.from_assistant("No idea.")])) == {"unknown", "reason"}
        assert set(router.run(replies=[ChatMessage.from_assistant("unknown")])) == {"known"}

    def test_min_confidence(self):
        router = UnknownRouter(min_confidence=0.5)
        confident = [reply_with_logprobs("Paris", [-0.1, -0.05])]
        unsure = [reply_with_logprobs("Paris", [-2.0, -3.0])]
        no_logprobs = [ChatMessage.from_assistant("Paris")]
        assert router.run(replies=confident, query="Q?") == {"known": confident}
        assert router.run(replies=unsure, query="Q?", documents=DOCUMENTS) == {
            "unknown": unsure,
            "reason": "confidence 0.08 < 0.5",
            "fallback_query": "Q?",
            "fallback_documents": DOCUMENTS,
        }
        assert router.run(replies=no_logprobs) == {"known": no_logprobs}
        # A confident abstention is still unknown.
        assert set(router.run(replies=[reply_with_logprobs("unknown", [-0.01])])) == {"unknown", "reason"}

    def test_min_confidence_disabled_by_default(self):
        unsure = [reply_with_logprobs("Paris", [-5.0])]
        assert UnknownRouter().run(replies=unsure) == {"known": unsure}

    def test_min_confidence_one(self):
        router = UnknownRouter(min_confidence=1.0)
        assert set(router.run(replies=[reply_with_logprobs("Paris", [0.0])])) == {"known"}
        assert set(router.run(replies=[reply_with_logprobs("Paris", [-0.001])])) == {"unknown", "reason"}

    @pytest.mark.parametrize("min_confidence", [0, 0.0, -0.1, 1.01, 2])
    def test_invalid_min_confidence(self, min_confidence):
        with pytest.raises(ValueError, match="min_confidence"):
            UnknownRouter(min_confidence=min_confidence)

    def test_invalid_unknown_pattern(self):
        with pytest.raises(ValueError, match="invalid regular expression"):
            UnknownRouter(unknown_patterns=["(oops"])

    def test_routes_known_and_unknown(self):
        router = UnknownRouter()
        assert set(router.run(replies=[ChatMessage.from_assistant("unknown")])) == {"unknown", "reason"}
        assert set(router.run(replies=[ChatMessage.from_assistant("Paris")])) == {"known"}

    def test_to_dict_defaults(self):
        assert _to_dict(UnknownRouter()) == {
            "type": "haystack_fusion.components.unknown_router.UnknownRouter",
            "init_parameters": {
                "answer_pattern": PROMPTS["figure7"].answer_pattern,
                "unknown_patterns": None,
                "min_confidence": None,
                "demonstrations": None,
                "confidence": "logprobs",
                "streaming_callback": None,
            },
        }

    def test_to_dict_custom(self):
        router = UnknownRouter(answer_pattern=COT_ANSWER_PATTERN, unknown_patterns=["^no idea$"], min_confidence=0.3)
        assert _to_dict(router) == {
            "type": "haystack_fusion.components.unknown_router.UnknownRouter",
            "init_parameters": {
                "answer_pattern": COT_ANSWER_PATTERN,
                "unknown_patterns": ["^no idea$"],
                "min_confidence": 0.3,
                "demonstrations": None,
                "confidence": "logprobs",
                "streaming_callback": None,
            },
        }

    def test_from_dict_round_trip(self):
        router = UnknownRouter(answer_pattern=None, unknown_patterns=["^no idea$"], min_confidence=0.3)
        restored = _from_dict(_to_dict(router))
        assert _to_dict(restored) == _to_dict(router)
        assert restored.answer_pattern is None
        assert restored.unknown_patterns == ["^no idea$"]
        assert restored.min_confidence == 0.3
        assert set(restored.run(replies=[ChatMessage.from_assistant("no idea")])) == {"unknown", "reason"}

    def test_yaml_round_trip_in_pipeline(self):
        pipeline = Pipeline()
        pipeline.add_component("router", UnknownRouter(min_confidence=0.5))
        assert Pipeline.loads(pipeline.dumps()) == pipeline

    async def test_run_async_same_result(self):
        router = UnknownRouter(min_confidence=0.5)
        for replies in (
            [ChatMessage.from_assistant("Paris")],
            [ChatMessage.from_assistant("unknown")],
            [reply_with_logprobs("Paris", [-3.0])],
            [],
        ):
            expected = router.run(replies=replies, query="Q?", documents=DOCUMENTS)
            assert await router.run_async(replies=replies, query="Q?", documents=DOCUMENTS) == expected

    def test_in_pipeline_only_one_branch_is_emitted(self):
        pipeline = Pipeline()
        pipeline.add_component("router", UnknownRouter())
        known = pipeline.run({"router": {"replies": [ChatMessage.from_assistant("Paris")], "query": "Q?"}})
        assert set(known["router"]) == {"known"}
        unknown = pipeline.run(
            {"router": {"replies": [ChatMessage.from_assistant("unknown")], "query": "Q?", "documents": DOCUMENTS}}
        )
        assert set(unknown["router"]) == {"unknown", "reason", "fallback_query", "fallback_documents"}


class TestRouter:
    def test_invalid_answer_falls_back(self):
        router = UnknownRouter(demonstrations=list(PROMPTS["figure7"].demonstrations))
        result = router.run(replies=[ChatMessage.from_assistant("1925")], query="When?", documents=DOCUMENTS)
        assert result["reason"] == "invalid answer (demonstration answer)"
        assert result["fallback_documents"] == DOCUMENTS

    def test_serializes_every_setting(self):
        assert set(_to_dict(UnknownRouter())["init_parameters"]) == {
            "answer_pattern",
            "unknown_patterns",
            "min_confidence",
            "demonstrations",
            "confidence",
            "streaming_callback",
        }
        router = UnknownRouter(demonstrations=["x"])
        assert _to_dict(_from_dict(_to_dict(router))) == _to_dict(router)
