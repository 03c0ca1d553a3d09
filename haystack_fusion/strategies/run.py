"""Running a strategy pipeline on one question; reading its answer, evidence, usage and failures from the outputs."""

from __future__ import annotations

import dataclasses
import textwrap
import time
from typing import Any

from haystack import Document, Pipeline
from haystack.dataclasses import GeneratedAnswer

from haystack_fusion.answers import (
    UNKNOWN,
    UnknownDetector,
    answer_confidence,
    is_invalid,
    normalize_answer,
    validate_query,
)
from haystack_fusion.components.speculation import Speculation
from haystack_fusion.failures import CallFailure, failed_run
from haystack_fusion.llm import ChatGeneratorWrapper, model_name, reply_usage
from haystack_fusion.strategies.config import RETRIEVER, SPLIT_ROUTER
from haystack_fusion.strategies.record import (
    Evidence,
    InvalidAnswer,
    Notes,
    StageResult,
    StrategyRun,
    SureEvidence,
    SureScore,
    Usage,
    Vote,
    sum_usages,
)
from haystack_fusion.strategies.registry import strategy_of
from haystack_fusion.sure import summary_is_label

_DETECTOR = UnknownDetector()


def excerpt(text: str | None, chars: int) -> str:
    """`text` with whitespace collapsed, shortened at a word boundary to at most `chars` characters."""
    return textwrap.shorten(text or "", width=chars, placeholder=" ...")


def rounded(value: Any) -> Any:
    """A score as shown: a float rounded to 2 decimals; anything else as it is."""
    return round(value, 2) if isinstance(value, float) else value


def passages(run: StrategyRun) -> list[Document]:
    """Every passage the run read: the retrieved ones in rank order, then any other passage the answer came from."""
    retrieved = {document.id for document in run.documents}
    return [*run.documents, *(d for d in run.answer.documents or [] if d.id not in retrieved)]


def supporting_ids(run: StrategyRun) -> set[str]:
    """The ids of the passages behind the answer: its voters and those holding it; none for unknown or rejected."""
    answer = run.answer
    text = normalize_answer(answer.data or "")
    if not text or _DETECTOR.is_unknown(answer.data) or is_invalid(answer.meta):
        return set()
    voters = {document.id for document in answer.documents or []} if answer.meta.get("votes") is not None else set()
    return voters | {d.id for d in passages(run) if f" {text} " in f" {normalize_answer(d.content or '')} "}


def cited_sources(run: StrategyRun) -> list[Document]:
    """The passages a reply cites, in `passages` order: the supporting ones, else every retrieved one."""
    supporting = supporting_ids(run)
    return [d for d in passages(run) if d.id in supporting] or list(run.documents)


def evidence_line(run: StrategyRun) -> str:
    """The evidence as one plain-text line ("" for none)."""
    evidence, parts = run.evidence, []
    if evidence.fallback is not None:
        parts.append(f"fallback fired: {'yes' if evidence.fallback else 'no'}")
    if evidence.votes is not None:
        votes = ", ".join(f"{answer!r}: {count}" for answer, count in evidence.votes.items())
        parts.append(f"votes: {{{votes}}}" if votes else "votes: none (every passage said unknown)")
    if evidence.sure is not None and evidence.sure.scores:
        scores = [
            f"{a.data!r}: v={rounded(a.meta.get('validity'))} r={rounded(a.meta.get('ranking'))}" for a in run.answers
        ]
        parts.append(f"SuRe scores: {', '.join(scores)}")
    elif evidence.candidates is not None and evidence.votes is None:
        parts.append(f"candidates: {evidence.candidates}")
    if evidence.notes is not None:
        relevance = ", ".join(f"[{i}] {note['relevance']}" for i, note in enumerate(evidence.notes.notes, start=1))
        parts.append(f"notes: {relevance or 'none'}; answer from {evidence.notes.answer_source}")
    return " | ".join(parts)


def source_title(document: Document) -> str:
    """`meta["title"]`, else `meta["file"]`, else "passage " and the first 8 characters of the id."""
    meta = document.meta or {}
    return meta.get("title") or meta.get("file") or f"passage {document.id[:8]}"


def sources_text(run: StrategyRun) -> str:
    """ "Sources:" and a line per `cited_sources` passage ("[1] title: the first 200 characters"); "" for none."""
    lines = [
        f"[{i}] {f'{title}: ' if (title := (d.meta or {}).get('title') or (d.meta or {}).get('file')) else ''}"
        f"{excerpt(d.content, 200)}"
        for i, d in enumerate(cited_sources(run), start=1)
    ]
    return "Sources:\n" + "\n".join(lines) if lines else ""


def chat_text(run: StrategyRun) -> str:
    """The answer and, after a blank line, its `sources_text`: plain text for a chat reply or a tool result."""
    sources = sources_text(run)
    return f"{run.answer_text()}\n\n{sources}" if sources else run.answer_text()


def run_strategy(
    pipeline: Pipeline, query: str, *, top_k: int | None = None, retriever_inputs: dict[str, Any] | None = None
) -> StrategyRun:
    """
    Ask one question through a strategy pipeline and gather the `StrategyRun`.

    :param top_k: Passages to retrieve; None keeps the retriever's own. `retriever_inputs`: its further run inputs.
    :raises ValueError: If the question is empty or invalid, or the pipeline names no registered strategy.
    :raises LLMCallsFailedError: If every LLM call of a round, or the strategy's only call, failed.
    """
    stages = strategy_of(pipeline).stages  # ValueError for an unregistered strategy, before anything runs
    reader = stages[0].component if len(stages) == 1 and stages[0].kind == "answer" else None
    query = validate_query(query)
    data: dict[str, dict[str, Any]] = {name: {"query": query} for name, s in pipeline.inputs().items() if "query" in s}
    retriever = {**({"top_k": top_k} if top_k is not None else {}), **(retriever_inputs or {})}
    if retriever:
        data.setdefault(RETRIEVER, {}).update(retriever)
    start = time.perf_counter()
    with failed_run(f"strategy {pipeline.metadata['strategy']!r}", reader=reader):
        outputs = pipeline.run(data=data, include_outputs_from={name for name, _ in pipeline.walk()})
    return strategy_run(pipeline, query, outputs, seconds=time.perf_counter() - start)


def strategy_run(
    pipeline: Pipeline, query: str, outputs: dict[str, dict[str, Any]], *, seconds: float = 0.0
) -> StrategyRun:
    """
    Read a `StrategyRun` from every component's outputs (`Pipeline.run`, or `run_async_generator`'s merged). An answer
    gets `meta["confidence"]` when it can; a fallback strategy's gets `stage`, `stages` and every stage's `failures`.

    :raises ValueError: If the pipeline names no registered strategy.
    """
    strategy = strategy_of(pipeline)
    ran: dict[str, dict[str, Any]] = {s.kind: outputs[s.component] for s in strategy.stages if s.component in outputs}
    answers = outputs.get(strategy.answer_component, {}).get("answers") or []
    answer = answers[0] if answers else GeneratedAnswer(data=UNKNOWN, query=query, documents=[], meta={})
    voted = (ran.get("post_fusion", {}).get("answers") or [None])[0]
    summarizer = ran.get("summaries")
    evidence = Evidence(
        components_run=sorted(outputs), candidates=(summarizer or ran.get("post_fusion") or {}).get("candidates")
    )
    if voted:
        evidence.vote = Vote(voted.meta.get("votes"), voted.meta.get("vote_share"), voted.meta.get("invalid_answers"))
    if summarizer or "verification" in ran:
        summaries = summarizer.get("summaries") if summarizer else None
        candidates = (summarizer or {}).get("candidates") or []
        evidence.sure = SureEvidence(
            summaries=summaries,
            label_summaries=sum(summary_is_label(summary, candidates) for summary in summaries or []),
            invalid_candidates=len(((summarizer or {}).get("meta") or {}).get("invalid_candidates") or []),
            scores=[SureScore.of(a.meta) for a in answers] if "verification" in ran else None,
        )
    if "notes" in ran:
        evidence.notes = Notes(ran["notes"].get("notes") or [], answer.meta.get("answer_source"))
    if "concatenation" in ran:
        evidence.stages = _stages(ran, outputs.get(SPLIT_ROUTER, {}).get("split_reason"))
        stages = [stage.to_dict() for stage in evidence.stages]
        answer.meta.update(stage=stages[-1]["stage"], stages=stages)
    for item in answers:
        if "confidence" not in item.meta and (confidence := answer_confidence(item.meta, item.data)) is not None:
            item.meta["confidence"] = confidence
    evidence.confidence = answer.meta.get("confidence")
    evidence.finish_reason = answer.meta.get("finish_reason")  # a one-reply answer: did the token cap cut it?
    evidence.invalid = _invalid(answer.meta)
    usages: dict[str, list[Usage]] = {}
    for name, output in outputs.items():
        meta = _own_meta(pipeline, name, output)
        evidence.failures += [CallFailure.from_dict({**f, "component": name}) for f in meta.get("failures") or []]
        if meta.get("usage") is not None:
            used = [Usage.of(meta["usage"])]
        elif replies := output.get("replies"):
            used = [*(Usage.of(reply_usage(reply)) for reply in replies), Usage(rounds=1)]
        else:
            continue
        usages.setdefault(model_name(pipeline.get_component(name)), []).extend(used)
    if evidence.failures and "concatenation" in ran:  # the later stage's answer lists the earlier stages' failures
        answer = dataclasses.replace(answer, meta={**answer.meta, "failures": [f.to_dict() for f in evidence.failures]})
        answers = [answer, *answers[1:]] if answers else answers
    documents = outputs.get(RETRIEVER, {}).get("documents") or []
    by_model = {model: sum_usages(used) for model, used in usages.items()}
    total = sum_usages(usage for used in usages.values() for usage in used)
    return StrategyRun(answer, answers, documents, evidence, total, seconds, strategy.name, by_model)


def _invalid(meta: dict[str, Any]) -> InvalidAnswer | None:
    if not is_invalid(meta):
        return None
    source = meta.get("answer_source") or "invalid"
    return InvalidAnswer(meta.get("invalid_reason"), meta.get("rejected_answer"), source)


def answers_run(answers: list[GeneratedAnswer], documents: list[Document]) -> StrategyRun:
    """A run read from `FusionAnswerer`'s answers (best first) alone: the evidence their `meta` carries; no stages,
    candidates, usage or time, `strategy` ""."""
    answer = answers[0] if answers else GeneratedAnswer(data=UNKNOWN, query="", documents=[], meta={})
    meta = answer.meta
    evidence = Evidence(confidence=meta.get("confidence"), invalid=_invalid(meta))
    if meta.get("votes") is not None:
        evidence.vote = Vote(meta["votes"], meta.get("vote_share"))
    if any("validity" in item.meta or "ranking" in item.meta for item in answers):
        evidence.sure = SureEvidence(scores=[SureScore.of(item.meta) for item in answers])
    if "notes" in meta:
        evidence.notes = Notes(meta["notes"] or [], meta.get("answer_source"))
    return StrategyRun(answer, answers, documents, evidence, usage=Usage(), seconds=0.0, strategy="")


def _own_meta(pipeline: Pipeline, name: str, output: dict[str, Any]) -> dict[str, Any]:
    """A `ChatGeneratorWrapper`'s `meta` output (a `Speculation`'s usage), else its first answer's `meta`; {} else."""
    if not isinstance(pipeline.get_component(name), ChatGeneratorWrapper):
        return {}
    if isinstance(speculation := output.get("speculation"), Speculation):
        return {"usage": speculation.usage}
    if isinstance(output.get("meta"), dict):
        return output["meta"]
    return next((answer.meta for answer in output.get("answers") or []), {})


def _stages(ran: dict[str, dict[str, Any]], split_reason: str | None) -> list[StageResult]:
    """A fallback strategy's stages that ran, in order; concatenation's carries its answer's `confidence` (for
    replaying tau)."""
    routed = ran["concatenation"]
    reply = next(iter(routed.get("known") or routed.get("unknown") or []), None)
    confidence = None if reply is None else reply.meta.get("confidence", answer_confidence(reply.meta))
    if "unknown" not in routed:
        return [StageResult("concatenation", True, confidence=confidence)]
    trace = [StageResult("concatenation", False, routed.get("reason"), confidence)]
    if split_reason and "post_fusion" in ran:
        return [*trace, StageResult("post_fusion", False, split_reason), StageResult("sure", "verification" in ran)]
    return [*trace, StageResult("post_fusion", True)]
