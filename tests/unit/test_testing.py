"""
The test doubles of `haystack_fusion.testing`: the scripted generator, the prompt-aware replies (keyed on the prompt
registry, so every registered prompt is answered in a form its parser reads), and that the module imports without the
test server's dependencies.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest
from haystack import Document
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.dataclasses import ChatMessage
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.components.candidate_summarizer import clean_summary
from haystack_fusion.notes import parse_document_note, parse_single_call
from haystack_fusion.prompts import PROMPTS, format_passages, render
from haystack_fusion.prompts.sure import candidate_prompt_variables, few_shot_examples
from haystack_fusion.strategies import STRATEGIES, build_pipeline, run_strategy
from haystack_fusion.sure import parse_candidates, parse_preference, parse_validity
from haystack_fusion.testing import (
    AsyncScriptedChatGenerator,
    PromptAwareChatGenerator,
    PromptReplies,
    ScriptedChatGenerator,
    _fixed_text,
    identify_prompt,
)

QUERY = "Which city is the capital of France?"
DOCUMENTS = [
    Document(id="paris", content="Paris is the capital of France.", meta={"title": "Paris"}),
    Document(id="lyon", content="Lyon is the third-largest city of France.", meta={"title": "Lyon"}),
    Document(id="bread", content="Baguettes are long loaves of bread.", meta={"title": "Bread"}),
]
ANSWERS = ("Paris", "Lyon")
K = 2


def variables(name: str, documents: list[Document] = DOCUMENTS) -> dict[str, Any]:
    """Values for every variable a registered template uses, as the components give them."""
    passages = format_passages(documents)
    summaries = ["Paris is the capital of France, the first passage says.", "Lyon is a large French city."]
    values: dict[str, Any] = {
        "passages": passages,
        "query": QUERY,
        "candidates": list(ANSWERS),
        "num_passages": len(documents),
        "examples": few_shot_examples(K),
        "target": 0,
        "prediction": "Paris",
        "summary": summaries[0],
        "summary_1": summaries[0],
        "summary_2": summaries[1],
        "summaries": summaries,
        "notes": [{"label": "answers directly", "note": "Paris is the capital."}],
        "step_5": "5. If no passage answers the question, answer unknown.",
        **candidate_prompt_variables(K),
    }
    if name == "con_single_call":
        values["k_words"] = "three"
    if name == "standalone_question":
        values["history"] = "User: Paris is the capital of France, the first passage says.\nAssistant: Yes."
    return values


def rendered(name: str, documents: list[Document] = DOCUMENTS) -> str:
    return render(PROMPTS[name], **variables(name, documents))[0].text or ""


class TestScriptedChatGenerator:
    def test_a_fixed_reply_and_the_calls_recorded(self):
        llm = ScriptedChatGenerator("Paris")
        result = llm.run([ChatMessage.from_user("hi")], generation_kwargs={"temperature": 0})
        assert result["replies"][0].text == "Paris"
        assert llm.prompts == ["hi"]
        assert llm.kwargs == [{"temperature": 0}]
        assert llm.calls == 1
        assert [m.text for m in llm.messages[0]] == ["hi"]

    def test_a_reply_function_of_the_prompt(self):
        llm = ScriptedChatGenerator(lambda prompt: prompt.upper())
        assert llm.run([ChatMessage.from_user("hi")])["replies"][0].text == "HI"

    def test_a_list_of_replies_in_call_order(self):
        llm = ScriptedChatGenerator(["one", "two"])
        assert [llm.run([ChatMessage.from_user("x")])["replies"][0].text for _ in range(2)] == ["one", "two"]
        with pytest.raises(RuntimeError, match="no scripted reply left for call 3"):
            llm.run([ChatMessage.from_user("x")])

    @pytest.mark.parametrize("fail_on", ["boom", lambda prompt: prompt.endswith("boom")])
    def test_failures_are_raised_and_recorded(self, fail_on):
        llm = ScriptedChatGenerator("ok", fail_on=fail_on, error="backend down")
        assert llm.run([ChatMessage.from_user("fine")])["replies"][0].text == "ok"
        with pytest.raises(RuntimeError, match="backend down"):
            llm.run([ChatMessage.from_user("it goes boom")])
        assert llm.calls == 2

    def test_async_run_waits_its_latency_on_the_loop(self):
        llm = AsyncScriptedChatGenerator("Paris", latency=0.05)

        async def three() -> list[dict[str, Any]]:
            return await asyncio.gather(*(llm.run_async([ChatMessage.from_user(str(i))]) for i in range(3)))

        results = asyncio.run(three())
        assert [r["replies"][0].text for r in results] == ["Paris"] * 3
        assert sorted(llm.prompts) == ["0", "1", "2"]

    def test_to_dict_round_trip_with_an_importable_reply_function(self):
        llm = ScriptedChatGenerator(identify_prompt, fail_on="boom", generation_kwargs={"stop": ["\n"]})
        data = llm.to_dict()
        assert data["init_parameters"]["reply"] == {"callable": "haystack_fusion.testing.identify_prompt"}
        copy = ScriptedChatGenerator.from_dict(data)
        assert (copy.reply, copy.fail_on, copy.generation_kwargs) == (identify_prompt, "boom", {"stop": ["\n"]})

    def test_negative_latency_is_refused(self):
        with pytest.raises(ValueError, match="latency"):
            ScriptedChatGenerator(latency=-1)

    def test_a_generator_with_settings_is_copied_with_stop_sequences(self):
        """A strategy's one-prompt chain rebuilds the generator from `to_dict`: a scripted one survives it."""
        store = InMemoryDocumentStore()
        store.write_documents(DOCUMENTS)
        llm = ScriptedChatGenerator("Paris", generation_kwargs={})
        pipeline = build_pipeline("concatenation", retriever=InMemoryBM25Retriever(store), chat_generator=llm)
        assert run_strategy(pipeline, QUERY).answer.data == "Paris"


class TestIdentifyPrompt:
    @pytest.mark.parametrize("name", list(PROMPTS))
    def test_every_registered_prompt_is_recognised(self, name):
        found = identify_prompt(rendered(name))
        assert found is not None
        # templates whose fixed text is the same (they differ only in their variables) are answered alike
        assert found == name or _fixed_text(PROMPTS[found].text) == _fixed_text(PROMPTS[name].text)

    def test_anything_else_is_not_ours(self):
        assert identify_prompt("What is the capital of France?") is None


class TestPromptReplies:
    @pytest.mark.parametrize("name", list(PROMPTS))
    def test_every_registered_prompt_is_answered_in_a_form_its_parser_reads(self, name):
        replies = PromptReplies(ANSWERS, concatenation_unknown=0.0)
        reply = replies(rendered(name))
        if name in ("sure_candidates", "sure_few_shot_candidates"):
            assert sorted(parse_candidates(reply, K)) == sorted(ANSWERS)
        elif name in ("sure_summary", "sure_few_shot_summary", "sure_generic_summary"):
            assert reply.endswith("[DONE]")
            assert clean_summary(reply)
        elif name == "sure_validity":
            assert reply in ("True", "False")
            assert parse_validity(reply) is (reply == "True")
        elif name == "sure_ranking":
            assert parse_preference(reply) == (1 if reply == "Passage 1" else 2)
        elif name == "con_single_call":
            parsed = parse_single_call(reply, 3)
            assert parsed.answer in ANSWERS
            assert any(parsed.mentioned)
        elif name == "con_document_note":
            note, label = parse_document_note(reply)
            assert note
            assert label is not None
        elif name == "standalone_question":
            assert PROMPTS[name].extract_answer(reply) == QUERY
        else:  # the prompts whose answer the template's own pattern reads
            assert PROMPTS[name].extract_answer(reply) in ANSWERS

    def test_a_request_body_is_answered_like_its_prompt(self):
        replies = PromptReplies(ANSWERS)
        prompt = rendered("sure_validity")
        assert replies({"messages": [{"role": "user", "content": prompt}]}) == replies(prompt)

    def test_concatenation_unknown_and_failing_shares(self):
        prompt = rendered("figure7")
        assert PromptReplies(ANSWERS, concatenation_unknown=1.0)(prompt) == "unknown"
        with pytest.raises(RuntimeError, match="concatenation_fails"):
            PromptReplies(ANSWERS, concatenation_fails=1.0)(prompt)
        one_passage = rendered("figure7", DOCUMENTS[:1])
        assert PromptReplies(ANSWERS, concatenation_unknown=1.0)(one_passage) in ANSWERS

    def test_choose_and_the_verifier_shares(self):
        replies = PromptReplies(ANSWERS, validity_true=1.0, prefer_first=0.0, choose=lambda prompt: "Lyon")
        assert replies(rendered("sure_base")) == "Lyon"
        assert replies(rendered("sure_validity")) == "True"
        assert replies(rendered("sure_ranking")) == "Passage 2"

    @pytest.mark.parametrize(
        "settings", [{"answers": []}, {"concatenation_unknown": 1.5}, {"validity_true": -0.1}, {"prefer_first": 2}]
    )
    def test_invalid_settings_are_refused(self, settings):
        with pytest.raises(ValueError, match=r"answers|must be in"):
            PromptReplies(**settings)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_every_strategy_runs_end_to_end_on_the_prompt_aware_generator(strategy):
    store = InMemoryDocumentStore()
    store.write_documents(DOCUMENTS)
    llm = PromptAwareChatGenerator(PromptReplies(ANSWERS, concatenation_unknown=1.0))
    pipeline = build_pipeline(strategy, retriever=InMemoryBM25Retriever(store, top_k=3), chat_generator=llm)
    run = run_strategy(pipeline, QUERY)
    assert run.answer.data in (*ANSWERS, "unknown")
    assert llm.calls >= 1


def test_the_testing_module_imports_without_the_servers_dependencies():
    code = (
        "import sys; sys.modules['fastapi'] = None; sys.modules['uvicorn'] = None\n"
        "import haystack_fusion.testing as testing\n"
        "assert testing.ScriptedChatGenerator and testing.PromptReplies\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
