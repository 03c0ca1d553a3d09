"""How a strategy's run reads: the CLI's lines, the served stream's status lines, the chat reply's evidence."""

from haystack import Document
from haystack.components.generators.chat import MockChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.dataclasses import GeneratedAnswer
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.serving.presentation import (
    api_result,
    evidence_markdown,
    evidence_summary,
    format_run,
    narrate,
    plural,
    round_start,
    source_title,
    streamed_component,
)
from haystack_fusion.strategies import (
    STRATEGIES,
    Evidence,
    InvalidAnswer,
    Notes,
    StageResult,
    StrategyRun,
    SureEvidence,
    SureScore,
    Usage,
    build_pipeline,
    chat_text,
)

USAGE = Usage(prompt_tokens=10, completion_tokens=2, calls=1, failed_calls=0, rounds=1)


def run_with(evidence: Evidence, answers: list[GeneratedAnswer], strategy: str = "concatenation") -> StrategyRun:
    return StrategyRun(
        answer=answers[0],
        answers=answers,
        documents=[Document(id="d", content="Paris is the capital.", meta={"title": "Paris"})],
        evidence=evidence,
        usage=USAGE,
        seconds=0.5,
        strategy=strategy,
    )


def pipeline_for(strategy: str):
    store = InMemoryDocumentStore()
    return build_pipeline(strategy, retriever=InMemoryBM25Retriever(store), chat_generator=MockChatGenerator())


def test_sure_evidence_line():
    answers = [
        GeneratedAnswer(data="Paris", query="q", documents=[], meta={"validity": 1.0, "ranking": 1.0}),
        GeneratedAnswer(data="Lyon", query="q", documents=[], meta={"validity": 0.0, "ranking": 0.0}),
    ]
    text = format_run(
        "q",
        run_with(
            Evidence(candidates=["Paris", "Lyon"], sure=SureEvidence(scores=[SureScore(0, 1.0, 1.0, 2.0)])),
            answers,
            "sure",
        ),
    )
    assert "SuRe scores: 'Paris': v=1.0 r=1.0, 'Lyon': v=0.0 r=0.0" in text
    assert "Strategy: sure (Kim et al." in text


def test_chain_of_note_evidence_line():
    notes = [{"document_id": "d", "note": "says Paris", "relevance": "direct"}]
    answer = GeneratedAnswer(data="Paris", query="q", documents=[], meta={})
    text = format_run("q", run_with(Evidence(notes=Notes(notes, "passages")), [answer]))
    assert "notes: [1] direct; answer from passages" in text


def test_an_invalid_answer_says_what_was_rejected():
    answer = GeneratedAnswer(data="", query="q", documents=[], meta={})
    text = format_run("q", run_with(Evidence(invalid=InvalidAnswer("passage markup", "1005dbc6")), [answer]))
    assert "Answer:   (no valid answer: passage markup: '1005dbc6')" in text


def test_mcq_candidates_line():
    answer = GeneratedAnswer(data="Paris", query="q", documents=[], meta={})
    text = format_run("q", run_with(Evidence(candidates=["Paris", "Lyon"]), [answer]))
    assert "candidates: ['Paris', 'Lyon']" in text


def test_cascade_stages_and_confidence_lines():
    stages = [
        StageResult("concatenation", False, "confidence 0.21 < 0.25"),
        StageResult("post_fusion", False, "tie at the top"),
        StageResult("sure", True),
    ]
    answer = GeneratedAnswer(data="Paris", query="q", documents=[], meta={})
    text = format_run("q", run_with(Evidence(stages=stages, confidence=0.5), [answer]))
    assert "Stages:   concatenation (confidence 0.21 < 0.25) -> post_fusion (tie at the top) -> sure answered" in text
    assert "Confidence: 0.50" in text


def test_counts_read_as_english():
    assert (plural(1, "LLM call"), plural(0, "LLM call"), plural(3, "passage")) == (
        "1 LLM call",
        "0 LLM calls",
        "3 passages",
    )
    answer = GeneratedAnswer(data="Paris", query="q", documents=[], meta={})
    run = run_with(Evidence(), [answer])
    assert evidence_summary(run) == "Sources and evidence (1 LLM call)"
    assert "**Usage**: 1 LLM call in 1 round, 10 prompt + 2 completion tokens" in evidence_markdown(run)
    assert "LLM: 1 call (0 failed) in 1 round, 10 prompt + 2 completion tokens" in format_run("q", run)


def test_a_source_is_named_by_its_title_else_its_file_else_its_id():
    assert source_title(Document(content="x", meta={"title": "SuRe", "file": "sure.md"})) == "SuRe"
    assert source_title(Document(content="x", meta={"file": "sure.md"})) == "sure.md"
    untitled = Document(content="x")
    assert source_title(untitled) == f"passage {untitled.id[:8]}"


def test_chat_text_and_api_result_show_the_answer_and_its_sources():
    answer = GeneratedAnswer(data="Paris", query="q", documents=[], meta={})
    run = run_with(Evidence(), [answer])
    assert chat_text(run) == "Paris\n\nSources:\n[1] Paris: Paris is the capital."
    result = api_result(run)
    assert (result["answer"], [source["title"] for source in result["sources"]]) == ("Paris", ["Paris"])


def test_every_strategy_declares_stages_whose_components_its_pipeline_has():
    for name, strategy in STRATEGIES.items():
        components = dict(pipeline_for(name).walk())
        assert strategy.stages, name
        assert all(stage.component in components for stage in strategy.stages), name


def test_the_first_round_is_named_by_the_first_stage():
    assert round_start(pipeline_for("concat_pf"), 5) == "Concatenation: reading the 5 passages together"
    assert round_start(pipeline_for("pf_concat"), 5) == "Post-fusion: reading the 5 passages one by one"
    assert round_start(pipeline_for("generic_summary"), 3) == "Summarizing the 3 passages"
    assert round_start(pipeline_for("sure"), 3).startswith("SuRe: proposing answer candidates")
    assert round_start(pipeline_for("chain_of_note"), 2).startswith("Chain-of-Note:")
    assert round_start(pipeline_for("concatenation"), 2) == "Reading the 2 passages together"


def test_narration_follows_the_declared_stages():
    state: dict = {}
    pipeline = pipeline_for("pf_concat")
    documents = [Document(content="a"), Document(content="b")]
    assert narrate("retriever", {"documents": documents}, pipeline, state) == [
        ("Retrieved 2 passages", True),
        ("Post-fusion: reading the 2 passages one by one", False),
    ]
    vote = GeneratedAnswer(data="Paris", query="q", documents=[], meta={"votes": {"paris": 2}})
    output = {"answers": [vote], "candidates": ["Paris"], "documents": documents}
    assert narrate("voter", output, pipeline, state) == [
        ("Post-fusion: Paris won 2 of 2 votes", True),
        ("Distilling 1 candidate from 2 passages", False),
    ]
    assert narrate("llm", {"replies": []}, pipeline, state) == [("Answer written", True)]
    assert narrate("passages", {}, pipeline, state) == []
    summarizer = {"candidates": ["Paris", "Lyon"], "summaries": ["s1", "s2"]}
    assert narrate("summarizer", summarizer, pipeline_for("sure"), {})[1] == (
        "SuRe: judging each summary's validity and ranking them pair-wise",
        False,
    )
    assert narrate("summarizer", summarizer, pipeline_for("mcq"), {})[1] == (
        "Answering from the summaries",
        False,
    )


def test_only_a_final_reply_that_nothing_replaces_is_streamed():
    streamed = {name: streamed_component(pipeline_for(name)) for name in STRATEGIES}
    assert streamed["concatenation"] == streamed["pf_concat"] == streamed["sure_sum_all"] == "llm"
    assert streamed["concat_pf"] is streamed["cascade"] is streamed["post_fusion"] is streamed["sure"] is None
    assert (streamed["chain_of_note"], streamed["chain_of_note_per_document"]) == (None, "note_taker")


def test_the_cli_names_each_source_by_its_title_else_its_file_else_its_id():
    answer = GeneratedAnswer(data="Paris", query="q", documents=[], meta={})
    documents = [
        Document(id="d1", content="Paris is the capital.", meta={"title": "Paris", "file": "paris.md"}, score=2.0),
        Document(id="d2", content="Post-fusion votes.", meta={"file": "docs/post-fusion.md"}, score=1.5),
        Document(id="0123456789abcdef", content="Untitled text."),
    ]
    run = StrategyRun(
        answer=answer,
        answers=[answer],
        documents=documents,
        evidence=Evidence(),
        usage=USAGE,
        seconds=0.5,
        strategy="concatenation",
    )
    lines = format_run("q", run).splitlines()
    assert "  [1] Paris (score 2.00) Paris is the capital." in lines
    assert "  [2] docs/post-fusion.md (score 1.50) Post-fusion votes." in lines
    assert "  [3] passage 01234567 (score -) Untitled text." in lines
