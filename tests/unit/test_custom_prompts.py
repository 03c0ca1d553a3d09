"""Prompts users adapt: each prompting component's templates and system prompt, and a strategy's `prompts`."""

from __future__ import annotations

from typing import Any

import pytest
from haystack import Document, Pipeline
from haystack.dataclasses import ChatMessage, ChatRole

from haystack_fusion import CandidateSummarizer, FusionAnswerer, NoteTaker, PostFusionVoter, SummaryVerifier
from haystack_fusion.prompts import PROMPTS, ChatPrompt, format_passages, render
from haystack_fusion.strategies import build_pipeline
from haystack_fusion.testing import PromptAwareChatGenerator, ScriptedChatGenerator

QUERY = "Was ist die Hauptstadt von Frankreich?"
DOCUMENTS = [Document(id="d0", content="Paris ist die Hauptstadt Frankreichs.")]
SYSTEM = "You answer questions about our product manuals."

GERMAN = """Antworte auf Deutsch, in wenigen Worten. Wenn du es nicht weisst, antworte "unbekannt".
Kontext: {{ passages }}
Frage: {{ query }}
Antwort:"""

MESSAGES = [
    ChatMessage.from_system("Antworte auf Deutsch."),
    ChatMessage.from_user("Kontext: {{ passages }}\nFrage: {{ query }}\nAntwort:"),
]

BLOCKS = """{% message role="system" %}Antworte auf Deutsch.{% endmessage %}
{% message role="user" %}Kontext: {{ passages }}
Frage: {{ query }}
Antwort:{% endmessage %}"""


def roles(messages: list[ChatMessage]) -> list[str]:
    return [message.role.value for message in messages]


def round_trip(component: Any) -> Any:
    data = component.to_dict()
    restored = type(component).from_dict(component.to_dict())
    assert restored.to_dict() == data
    return restored


class TestChatPrompt:
    @pytest.mark.parametrize("name", sorted(PROMPTS))
    def test_the_default_renders_as_render_does(self, name):
        prompt = ChatPrompt(PROMPTS[name])
        variables = dict.fromkeys(prompt.variables, "x")
        variables.update({v: [] for v in ("candidates", "summaries", "notes", "examples") if v in variables})
        if "target" in variables:
            variables.update(target=0, candidates=["Paris"])
        assert prompt.render(**variables) == render(PROMPTS[name], **variables)

    def test_the_default_with_a_system_prompt_adds_one_system_message_first(self):
        prompt = ChatPrompt(PROMPTS["figure7"], system_prompt=SYSTEM)
        messages = prompt.render(passages="[1] p", query="q")
        assert roles(messages) == ["system", "user"]
        assert messages[0].text == SYSTEM
        assert messages[1:] == render(PROMPTS["figure7"], passages="[1] p", query="q")

    @pytest.mark.parametrize("template", [GERMAN, MESSAGES, BLOCKS], ids=["string", "messages", "message-blocks"])
    def test_a_custom_template_renders_as_chat_prompt_builder_does(self, template):
        messages = ChatPrompt(PROMPTS["figure7"], template).render(passages="[1] p", query="q")
        assert messages[-1].role == ChatRole.USER
        assert "Frage: q" in (messages[-1].text or "")
        if not isinstance(template, str) or "{% message" in template:
            assert roles(messages) == ["system", "user"]

    def test_the_system_prompt_is_sent_as_written_not_rendered(self):
        literal = "Keep {{ braces }} and {% tags %} as they are."
        for template in (None, GERMAN, MESSAGES, BLOCKS):
            messages = ChatPrompt(PROMPTS["figure7"], template, system_prompt=literal).render(passages="p", query="q")
            assert messages[0].role == ChatRole.SYSTEM
            assert messages[0].text == literal

    def test_the_parser_settings_stay_the_defaults(self):
        prompt = ChatPrompt(PROMPTS["figure7"], GERMAN)
        assert prompt.stop == PROMPTS["figure7"].stop
        assert prompt.demonstrations == PROMPTS["figure7"].demonstrations
        assert prompt.extract_answer("  Paris\nweil ...") == "Paris"

    def test_a_missing_variable_names_the_parameter_and_the_variables(self):
        expected = (
            "`prompt` does not use the variable(s) query that the component needs (required: passages, query); "
            "the variables this prompt gets: passages, query"
        )
        with pytest.raises(ValueError, match="does not use") as error:
            ChatPrompt(PROMPTS["figure7"], "Kontext: {{ passages }}\nAntwort:", parameter="prompt")
        assert str(error.value) == expected

    def test_an_unknown_variable_is_an_error(self):
        with pytest.raises(ValueError, match=r"`prompt` uses the variable\(s\) language that this prompt never gets"):
            ChatPrompt(PROMPTS["figure7"], GERMAN + " {{ language }}")

    @pytest.mark.parametrize("template", [42, [ChatMessage.from_user("{{ query }}"), "text"]])
    def test_a_template_of_another_type_is_an_error(self, template):
        with pytest.raises(ValueError, match="must be a string or a list of ChatMessage"):
            ChatPrompt(PROMPTS["figure7"], template)

    @pytest.mark.parametrize("system_prompt", ["", "  \n"])
    def test_an_empty_system_prompt_is_an_error(self, system_prompt):
        with pytest.raises(ValueError, match="`system_prompt` must be a non-empty string"):
            ChatPrompt(PROMPTS["figure7"], system_prompt=system_prompt)

    def test_a_system_prompt_that_ends_the_raw_block_is_an_error(self):
        with pytest.raises(ValueError, match=r"cannot hold a Jinja `\{% endraw %\}` tag"):
            ChatPrompt(PROMPTS["figure7"], GERMAN, system_prompt="Be brief. {%- endraw %}{{ query }}")


class TestPostFusionVoter:
    def test_sends_the_custom_prompt_with_the_system_prompt_first(self):
        llm = ScriptedChatGenerator(reply="Paris\n")
        voter = PostFusionVoter(chat_generator=llm, prompt=GERMAN, system_prompt=SYSTEM)
        result = voter.run(query=QUERY, documents=DOCUMENTS)
        assert result["answers"][0].data == "Paris"
        (messages,) = llm.messages
        assert roles(messages) == ["system", "user"]
        assert messages[0].text == SYSTEM
        expected = GERMAN.replace("{{ passages }}", format_passages(DOCUMENTS)).replace("{{ query }}", QUERY)
        assert messages[1].text == expected

    def test_keeps_figure7_stop_sequence_for_a_custom_prompt(self):
        llm = ScriptedChatGenerator(reply="Paris", generation_kwargs={})
        PostFusionVoter(chat_generator=llm, prompt=GERMAN).run(query=QUERY, documents=DOCUMENTS)
        assert llm.kwargs[0]["stop"] == list(PROMPTS["figure7"].stop)

    def test_unbekannt_is_unknown_with_a_pattern_for_it(self):
        llm = ScriptedChatGenerator(reply="unbekannt")
        default = PostFusionVoter(chat_generator=llm, prompt=GERMAN).run(query=QUERY, documents=DOCUMENTS)
        assert default["answers"][0].data == "unbekannt"
        voter = PostFusionVoter(chat_generator=llm, prompt=GERMAN, unknown_patterns=[r"^unbekannt$"])
        assert "unknown" in voter.run(query=QUERY, documents=DOCUMENTS)

    def test_a_prompt_without_query_is_an_error_at_init(self):
        with pytest.raises(ValueError, match=r"^`prompt` does not use the variable\(s\) query"):
            PostFusionVoter(chat_generator=ScriptedChatGenerator(), prompt="Kontext: {{ passages }}\nAntwort:")

    def test_to_dict_writes_the_prompts_unset_as_none(self):
        llm = ScriptedChatGenerator()
        default = PostFusionVoter(chat_generator=llm).to_dict()["init_parameters"]
        assert default["prompt"] is default["system_prompt"] is None
        voter = PostFusionVoter(chat_generator=llm, prompt=MESSAGES, system_prompt=SYSTEM)
        parameters = voter.to_dict()["init_parameters"]
        assert parameters["prompt"] == [message.to_dict() for message in MESSAGES]
        assert parameters["system_prompt"] == SYSTEM
        restored = round_trip(voter)
        assert restored.prompt == MESSAGES
        assert restored.system_prompt == SYSTEM


CANDIDATES_PROMPT = "{{ passages }}\nFrage: {{ query }}\nNenne {{ k_words }} Kandidaten als {{ answer_form }}:"
SUMMARY_PROMPT = (
    "{{ passages }}\nSchreibe eine Zusammenfassung, die {{ candidates[target] }} stuetzt.\nFrage: {{ query }}\nText:"
)


class TestCandidateSummarizer:
    def test_sends_both_custom_prompts_with_the_system_prompt_first(self):
        llm = ScriptedChatGenerator(reply=["(a) Paris, (b) Lyon", "Paris ist ... [DONE]", "Lyon ... [DONE]"])
        summarizer = CandidateSummarizer(
            chat_generator=llm,
            max_concurrency=1,
            candidates_prompt=CANDIDATES_PROMPT,
            summary_prompt=SUMMARY_PROMPT,
            system_prompt=SYSTEM,
        )
        result = summarizer.run(query=QUERY, documents=DOCUMENTS)
        assert result["candidates"] == ["Paris", "Lyon"]
        assert result["summaries"] == ["Paris ist ...", "Lyon ..."]
        assert all(roles(messages) == ["system", "user"] for messages in llm.messages)
        assert llm.prompts[0].endswith("Nenne two Kandidaten als (a) xx, (b) yy:")
        assert "die Paris stuetzt" in llm.prompts[1]
        assert "die Lyon stuetzt" in llm.prompts[2]

    def test_generic_mode_takes_the_summary_prompt(self):
        llm = ScriptedChatGenerator(reply="Paris ... [DONE]")
        summarizer = CandidateSummarizer(
            chat_generator=llm, mode="generic", summary_prompt="{{ passages }}\nFasse zusammen: {{ query }}"
        )
        assert summarizer.run(query=QUERY, documents=DOCUMENTS)["summaries"] == ["Paris ..."]
        assert llm.prompts[0].endswith(f"Fasse zusammen: {QUERY}")

    def test_the_few_shot_examples_reach_a_custom_candidates_prompt(self):
        template = (
            "{% for e in examples %}F: {{ e.question }} A: {{ e.answer }}\n{% endfor %}{{ passages }} {{ query }}"
        )
        llm = ScriptedChatGenerator(reply="(a) Paris, (b) Lyon")
        CandidateSummarizer(chat_generator=llm, mode="candidates", candidates_prompt=template).run(
            query=QUERY, documents=DOCUMENTS
        )
        assert "A: (a) Butch Vig, (b) Kurt Cobain" in llm.prompts[0]

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"candidates_prompt": "{{ passages }}"}, r"`candidates_prompt` does not use the variable\(s\) query"),
            ({"summary_prompt": "{{ passages }} {{ query }}"}, r"`summary_prompt` does not use .* candidates, target"),
            ({"mode": "generic", "candidates_prompt": CANDIDATES_PROMPT}, "not used in generic mode"),
            ({"mode": "candidates", "summary_prompt": SUMMARY_PROMPT}, "not used in candidates mode"),
        ],
    )
    def test_wrong_prompts_are_errors_at_init(self, kwargs, message):
        with pytest.raises(ValueError, match=message):
            CandidateSummarizer(chat_generator=ScriptedChatGenerator(), **kwargs)

    def test_to_dict_round_trip(self):
        summarizer = CandidateSummarizer(
            chat_generator=ScriptedChatGenerator(),
            candidates_prompt=CANDIDATES_PROMPT,
            summary_prompt=[ChatMessage.from_user(SUMMARY_PROMPT)],
            system_prompt=SYSTEM,
        )
        parameters = summarizer.to_dict()["init_parameters"]
        assert parameters["candidates_prompt"] == CANDIDATES_PROMPT
        assert parameters["summary_prompt"] == [ChatMessage.from_user(SUMMARY_PROMPT).to_dict()]
        restored = round_trip(summarizer)
        assert restored.summary_prompt == [ChatMessage.from_user(SUMMARY_PROMPT)]
        default = CandidateSummarizer(chat_generator=ScriptedChatGenerator()).to_dict()["init_parameters"]
        assert [default[name] for name in ("candidates_prompt", "summary_prompt", "system_prompt")] == [None] * 3


VALIDITY_PROMPT = "Frage: {{ query }}\nVorhersage: {{ prediction }}\nText: {{ summary }}\nStimmt das? True oder False:"
RANKING_PROMPT = "Frage: {{ query }}\nPassage 1: {{ summary_1 }}\nPassage 2: {{ summary_2 }}\nWelche ist besser?"


class TestSummaryVerifier:
    def test_sends_both_custom_prompts_with_the_system_prompt_first(self):
        llm = ScriptedChatGenerator(reply=["True", "False", "Passage 1", "Passage 2"])
        verifier = SummaryVerifier(
            chat_generator=llm,
            max_concurrency=1,
            validity_prompt=VALIDITY_PROMPT,
            ranking_prompt=RANKING_PROMPT,
            system_prompt=SYSTEM,
        )
        result = verifier.run(query=QUERY, candidates=["Paris", "Lyon"], summaries=["Paris ...", "Lyon ..."])
        assert result["answers"][0].data == "Paris"
        assert all(roles(messages) == ["system", "user"] for messages in llm.messages)
        assert llm.prompts[0].startswith(f"Frage: {QUERY}\nVorhersage: Paris")
        assert llm.prompts[2].endswith("Passage 1: Paris ...\nPassage 2: Lyon ...\nWelche ist besser?")

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"validity_prompt": "{{ query }} {{ summary }}"}, r"`validity_prompt` does not use .* prediction"),
            ({"ranking_prompt": "{{ query }} {{ summary_1 }}"}, r"`ranking_prompt` does not use .* summary_2"),
            ({"use_validity": False, "validity_prompt": VALIDITY_PROMPT}, "not used without validity"),
        ],
    )
    def test_wrong_prompts_are_errors_at_init(self, kwargs, message):
        with pytest.raises(ValueError, match=message):
            SummaryVerifier(chat_generator=ScriptedChatGenerator(), **kwargs)

    def test_to_dict_round_trip(self):
        verifier = SummaryVerifier(
            chat_generator=ScriptedChatGenerator(), validity_prompt=VALIDITY_PROMPT, system_prompt=SYSTEM
        )
        parameters = verifier.to_dict()["init_parameters"]
        assert parameters["validity_prompt"] == VALIDITY_PROMPT
        assert parameters["ranking_prompt"] is None
        assert round_trip(verifier).validity_prompt == VALIDITY_PROMPT


NOTE_PROMPT = "Frage: {{ query }}\n{{ passages }}\nNotiz:"
SINGLE_CALL_PROMPT = "Lies die {{ k_words }} Passagen.\n{{ step_5 }}\nFrage: {{ query }}\n{{ passages }}\nNotizen:"
SYNTHESIS_PROMPT = (
    "Frage: {{ query }}\n{% for n in notes %}Passage #{{ loop.index }} ({{ n.label }}): {{ n.note }}\n{% endfor %}"
    "Based on the information given in above passages, the answer is"
)


class TestNoteTaker:
    def test_single_call_sends_the_custom_answer_prompt(self):
        llm = ScriptedChatGenerator(reply="Passage #1 nennt Paris. Based on the passages, the answer is Paris")
        note_taker = NoteTaker(chat_generator=llm, answer_prompt=SINGLE_CALL_PROMPT, system_prompt=SYSTEM)
        result = note_taker.run(query=QUERY, documents=DOCUMENTS)
        assert result["answers"][0].data == "Paris"
        (messages,) = llm.messages
        assert roles(messages) == ["system", "user"]
        assert messages[0].text == SYSTEM
        assert messages[1].text.startswith("Lies die one Passagen.\n5. If no passage is relevant, directly provide")

    def test_per_document_sends_the_custom_note_and_synthesis_prompts(self):
        llm = ScriptedChatGenerator(reply=["Nennt Paris.\nRelevance: (a) answers directly", " Paris."])
        note_taker = NoteTaker(
            chat_generator=llm,
            mode="per_document",
            note_prompt=NOTE_PROMPT,
            answer_prompt=SYNTHESIS_PROMPT,
            system_prompt=SYSTEM,
        )
        result = note_taker.run(query=QUERY, documents=DOCUMENTS)
        assert result["answers"][0].data == "Paris"
        assert llm.prompts[0] == NOTE_PROMPT.replace("{{ query }}", QUERY).replace(
            "{{ passages }}", format_passages(DOCUMENTS, layout="titled")
        )
        assert llm.prompts[1].startswith(f"Frage: {QUERY}\nPassage #1 (answers directly): Nennt Paris.")
        assert all(roles(messages) == ["system", "user"] for messages in llm.messages)

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"answer_prompt": "{{ passages }}"}, r"`answer_prompt` does not use the variable\(s\) query"),
            ({"answer_prompt": "{{ query }} {{ notes }}"}, r"`answer_prompt` does not use the variable\(s\) passages"),
            (
                {"mode": "per_document", "answer_prompt": "{{ query }} {{ passages }}"},
                r"`answer_prompt` does not use the variable\(s\) notes",
            ),
            ({"mode": "per_document", "note_prompt": "{{ query }}"}, r"`note_prompt` does not use .* passages"),
            ({"note_prompt": NOTE_PROMPT}, "per-document mode only"),
        ],
    )
    def test_wrong_prompts_are_errors_at_init(self, kwargs, message):
        with pytest.raises(ValueError, match=message):
            NoteTaker(chat_generator=ScriptedChatGenerator(), **kwargs)

    def test_to_dict_round_trip(self):
        note_taker = NoteTaker(
            chat_generator=ScriptedChatGenerator(),
            mode="per_document",
            note_prompt=[ChatMessage.from_user(NOTE_PROMPT)],
            answer_prompt=SYNTHESIS_PROMPT,
            system_prompt=SYSTEM,
        )
        restored = round_trip(note_taker)
        assert restored.note_prompt == [ChatMessage.from_user(NOTE_PROMPT)]
        assert restored.answer_prompt == SYNTHESIS_PROMPT
        assert restored.system_prompt == SYSTEM


class TestStrategies:
    def test_the_prompts_reach_the_prompt_chain_and_the_voter(self):
        llm = ScriptedChatGenerator(reply="unknown")
        pipe = build_pipeline("concat_pf", chat_generator=llm, prompts={"figure7": GERMAN}, system_prompt=SYSTEM)
        pipe.run({"query": QUERY, "documents": DOCUMENTS})
        assert len(llm.messages) == 2  # concatenation said unknown, post-fusion asked the one passage
        for messages in llm.messages:
            assert roles(messages) == ["system", "user"]
            assert messages[0].text == SYSTEM
            assert messages[1].text.startswith("Antworte auf Deutsch")
        assert pipe.get_component("voter").prompt == GERMAN
        assert Pipeline.loads(pipe.dumps()) == pipe

    @pytest.mark.parametrize(
        ("strategy", "prompts", "component", "parameters"),
        [
            ("sure", {"sure_candidates": CANDIDATES_PROMPT}, "summarizer", {"candidates_prompt": CANDIDATES_PROMPT}),
            ("sure", {"sure_ranking": RANKING_PROMPT}, "verifier", {"ranking_prompt": RANKING_PROMPT}),
            ("generic_summary", {"sure_generic_summary": "{{ passages }} {{ query }}"}, "summarizer", None),
            ("chain_of_note", {"con_single_call": SINGLE_CALL_PROMPT}, "note_taker", None),
            ("chain_of_note_per_document", {"con_synthesis": SYNTHESIS_PROMPT}, "note_taker", None),
            ("chain_of_note_per_document", {"con_document_note": NOTE_PROMPT}, "note_taker", None),
            ("pf_concat", {"figure7": GERMAN}, "voter", {"prompt": GERMAN}),
        ],
    )
    def test_each_name_reaches_its_component(self, strategy, prompts, component, parameters):
        pipe = build_pipeline(strategy, chat_generator=ScriptedChatGenerator(), prompts=prompts, system_prompt=SYSTEM)
        written = pipe.get_component(component).to_dict()["init_parameters"]
        assert written["system_prompt"] == SYSTEM
        assert set(prompts.values()) <= {value for key, value in written.items() if key.endswith("prompt")}
        if parameters:
            assert parameters.items() <= written.items()

    def test_a_few_shot_strategy_takes_the_few_shot_names(self):
        pipe = build_pipeline(
            "sure",
            chat_generator=ScriptedChatGenerator(),
            few_shot=True,
            prompts={"sure_few_shot_summary": SUMMARY_PROMPT},
        )
        assert pipe.get_component("summarizer").summary_prompt == SUMMARY_PROMPT
        with pytest.raises(ValueError, match="'sure_summary', which strategy 'sure' does not render"):
            build_pipeline("sure", chat_generator=ScriptedChatGenerator(), few_shot=True, prompts={"sure_summary": "x"})

    @pytest.mark.parametrize(
        ("strategy", "name", "message"),
        [
            ("concatenation", "figure8", "`prompts` names no prompt 'figure8'; strategy 'concatenation' renders"),
            ("concatenation", "sure_validity", "'sure_validity', which strategy 'concatenation' does not render"),
            ("sure_rank_only", "sure_validity", "'sure_validity', which strategy 'sure_rank_only' does not render"),
            ("chain_of_note", "con_synthesis", "'con_synthesis', which strategy 'chain_of_note' does not render"),
        ],
    )
    def test_a_name_the_strategy_does_not_render_is_an_error(self, strategy, name, message):
        with pytest.raises(ValueError, match=message):
            build_pipeline(strategy, chat_generator=ScriptedChatGenerator(), prompts={name: GERMAN})

    def test_a_chain_template_must_use_the_variables_of_the_one_it_replaces(self):
        with pytest.raises(ValueError, match=r"`prompts\['sure_mcq'\]` does not use the variable\(s\) candidates"):
            build_pipeline(
                "mcq", chat_generator=ScriptedChatGenerator(), prompts={"sure_mcq": "{{ passages }} {{ query }}"}
            )

    def test_every_strategy_runs_with_a_system_prompt(self):
        for name in ("concatenation", "sure", "chain_of_note_per_document", "generic_summary", "cascade"):
            llm = PromptAwareChatGenerator()
            pipe = build_pipeline(name, chat_generator=llm, system_prompt=SYSTEM)
            pipe.run({"query": "What is the capital of France?", "documents": DOCUMENTS})
            assert llm.calls
            assert all(messages[0].text == SYSTEM for messages in llm.messages)

    def test_fusion_answerer_takes_them_as_settings_and_round_trips(self):
        llm = ScriptedChatGenerator(reply="Paris")
        settings = {"prompts": {"figure7": GERMAN}, "system_prompt": SYSTEM}
        answerer = FusionAnswerer(strategy="concatenation", chat_generator=llm, settings=settings)
        assert answerer.run(query=QUERY, documents=DOCUMENTS)["answers"][0].data == "Paris"
        assert llm.messages[0][0].text == SYSTEM
        assert llm.prompts[0].startswith("Antworte auf Deutsch")
        data = answerer.to_dict()
        assert data["init_parameters"]["settings"] == settings
        restored = FusionAnswerer.from_dict(answerer.to_dict())
        assert restored.to_dict() == data
        assert (
            restored.pipeline.get_component("prompt_builder").to_dict()
            == answerer.pipeline.get_component("prompt_builder").to_dict()
        )
