"""Running a strategy pipeline on one question and gathering its answer, evidence, usage and failures."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from haystack import Document, Pipeline
from haystack.dataclasses import GeneratedAnswer

from haystack_fusion.answers import UNKNOWN, answer_confidence
from haystack_fusion.llm import ChatGeneratorWrapper, reply_usage, sum_usage
from haystack_fusion.strategies.config import RETRIEVER, SPLIT_ROUTER, Stage, StageKind, Strategy
from haystack_fusion.strategies.registry import strategy_of
from haystack_fusion.sure import summary_is_label
from haystack_fusion.validation import is_invalid, validate_query


@dataclass
class StrategyRun:
    """
    The outcome of one question through one strategy pipeline.

    :param answer: The strategy's answer (the first of `answers`; "unknown" when there is none).
    :param answers: The full answer list of the strategy's answer component.
    :param documents: The retrieved passages (top-k, in rank order).
    :param evidence: What the strategy saw: `fallback` (concat_pf: did post-fusion run), `votes` (normalized answer
        -> count), `candidates` (the post-fusion pool, or SuRe's answer candidates), `summaries` (SuRe's summaries),
        `scores` (SuRe: per answer, best first, `candidate_index`, `validity`, `ranking`, `score`), `notes` and
        `answer_source` (Chain-of-Note), `label_summaries` (SuRe: how many summaries are only a candidate's label,
        `sure.summary_is_label`), `vote_share` (post-fusion's winner), `components_run` (names of the components that
        ran, sorted), `stages`
        (concat_pf, cascade: `stage_trace`), `confidence` (the answer's, in [0, 1], None when unavailable) and, only
        when an LLM call failed, `failures` (`pipeline_failures`: which component's call, and the error).
    :param usage: Summed usage of every LLM call: `prompt_tokens`, `completion_tokens`, `calls`, `failed_calls`,
        and `cached_tokens` when any call's provider reported them (`pipeline_usage`).
    :param seconds: Wall-clock time of the pipeline run, in seconds.
    :param strategy: The registered strategy that ran (the pipeline's `metadata["strategy"]`).
    """

    answer: GeneratedAnswer
    answers: list[GeneratedAnswer]
    documents: list[Document]
    evidence: dict[str, Any]
    usage: dict[str, int]
    seconds: float
    strategy: str

    def answer_text(self) -> str:
        """
        The answer as a person should read it: the answer, or, when the answer checks rejected it
        (`evidence["answer_source"] == "invalid"`), what was rejected and why, e.g.
        `(no valid answer: passage markup: '<passage key="1c6071d9">')`.
        """
        if self.evidence.get("answer_source") == "invalid":
            reason, rejected = self.evidence.get("invalid_reason"), self.evidence.get("rejected_answer")
            return f"(no valid answer: {reason}: {rejected!r})"
        return self.answer.data or ""


def pipeline_usage(pipeline: Pipeline, outputs: dict[str, dict[str, Any]]) -> dict[str, int]:
    """
    Sum the usage of every LLM call in a pipeline run's outputs (run with every component in include_outputs_from).

    Counts each ChatGenerator reply once (each generator run as one round), and for this package's LLM components
    (`ChatGeneratorWrapper`s) the usage they report in their `meta` (`_own_meta`) instead of their replies.

    :returns: Summed `prompt_tokens`, `completion_tokens`, `calls`, `failed_calls` and `rounds`; `cached_tokens` only
        when some provider reported it (`llm.reply_usage`).
    """
    usages: list[dict[str, Any] | None] = []
    for name, output in outputs.items():
        reported = (_own_meta(pipeline, name, output) or {}).get("usage")
        if reported is not None:
            usages.append(reported)
            continue
        replies = output.get("replies") or []
        usages.extend(reply_usage(reply) for reply in replies)
        if replies:
            usages.append({"rounds": 1})
    return sum_usage(usages)


def _own_meta(pipeline: Pipeline, name: str, output: dict[str, Any]) -> dict[str, Any] | None:
    """A `ChatGeneratorWrapper`'s `meta` output or first answer's `meta` ({} without either); None for others."""
    if not isinstance(pipeline.get_component(name), ChatGeneratorWrapper):
        return None
    if isinstance(output.get("meta"), dict):
        return output["meta"]
    answers = output.get("answers") or []
    return answers[0].meta if answers else {}


def pipeline_failures(pipeline: Pipeline, outputs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """
    The failed LLM calls of a pipeline run, as this package's LLM components report them in `meta["failures"]`.

    :returns: One dict per failed call: `component` (its name in the pipeline), the component's own keys (`index`,
        `round`, `rank`, `sample`, `call`) and `error` ("ExceptionType: message"); empty when none failed.
    """
    failures: list[dict[str, Any]] = []
    for name, output in outputs.items():
        meta = _own_meta(pipeline, name, output) or {}
        failures.extend({"component": name, **failure} for failure in meta.get("failures") or [])
    return failures


TRACE_NAMES = {"concatenation": "concatenation", "post_fusion": "post_fusion", "verification": "sure"}
"""The name a stage trace gives each stage kind of a fallback strategy (`concat_pf`, `cascade`)."""


def stage_trace(stages: Sequence[Stage], outputs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """
    Which stage of a fallback strategy (`concat_pf`, `cascade`) answered, and why the earlier ones did not.

    :returns: One entry per stage that ran, in order: `stage` ("concatenation", "post_fusion", "sure"), `answered`
        (bool) and, for a stage that passed the question on, `reason` (the router's: "unknown answer", "confidence
        0.31 < 0.5"; the voter's: "tie at the top", "vote share 0.40 < 0.5"). The last entry answered.
    """
    trace: list[dict[str, Any]] = []
    for stage in stages:
        if stage.kind not in TRACE_NAMES:
            continue
        name, output = TRACE_NAMES[stage.kind], outputs.get(stage.component, {})
        if stage.kind == "concatenation" and "unknown" in output:
            trace.append({"stage": name, "answered": False, "reason": output.get("reason")})
        elif stage.kind == "post_fusion" and (reason := outputs.get(SPLIT_ROUTER, {}).get("split_reason")):
            trace.append({"stage": name, "answered": False, "reason": reason})
        else:
            answered = stage.component in outputs if stage.kind == "verification" else True
            return [*trace, {"stage": name, "answered": answered}]
    return trace


def _outputs_of(strategy: Strategy, kind: StageKind, outputs: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The outputs of the strategy's first stage of `kind`, when it has one and it ran."""
    return next((outputs[s.component] for s in strategy.stages if s.kind == kind and s.component in outputs), None)


def run_strategy(
    pipeline: Pipeline,
    query: str,
    *,
    top_k: int | None = None,
    retriever_inputs: dict[str, Any] | None = None,
) -> StrategyRun:
    """
    Ask one question through a strategy pipeline and gather its answer, evidence and usage.

    :param pipeline: A pipeline from `build_pipeline` or its YAML (`metadata["strategy"]` names the strategy).
    :param top_k: Passages to retrieve; None keeps the retriever's own `top_k`.
    :param retriever_inputs: Further run inputs of the `retriever` component (the evaluation's per-question gold
        data for `EvalRetriever`).
    :returns: A `StrategyRun`. Every answer whose reply carried token log-probabilities gets `meta["confidence"]`
        (`answers.answer_confidence`); the answer of a fallback strategy gets `meta["stage"]` and `meta["stages"]`
        (`stage_trace`) and, when an LLM call of any stage failed, `meta["failures"]` (`pipeline_failures`: a failed
        concatenation call, which sent the question on to post-fusion, included).
    :raises ValueError: If the question is empty or only whitespace, or the pipeline names no registered strategy.
    """
    strategy_of(pipeline)  # ValueError for an unregistered strategy, before anything runs
    query = validate_query(query)
    data: dict[str, dict[str, Any]] = {
        component: {"query": query} for component, sockets in pipeline.inputs().items() if "query" in sockets
    }
    if top_k is not None:
        data.setdefault(RETRIEVER, {})["top_k"] = top_k
    if retriever_inputs:
        data.setdefault(RETRIEVER, {}).update(retriever_inputs)
    components = [component for component, _ in pipeline.walk()]
    start = time.perf_counter()
    outputs = pipeline.run(data=data, include_outputs_from=set(components))
    return strategy_run(pipeline, query, outputs, seconds=time.perf_counter() - start)


def strategy_run(
    pipeline: Pipeline, query: str, outputs: dict[str, dict[str, Any]], *, seconds: float = 0.0
) -> StrategyRun:
    """
    Gather a `StrategyRun` from a strategy pipeline's outputs: what `run_strategy` returns, for a run made another way
    (e.g. `Pipeline.run_async_generator` while streaming, as the Hayhooks wrappers do).

    :param outputs: Component name -> its outputs, for every component that ran.
    :param seconds: Wall-clock time of the run, in seconds.
    :raises ValueError: If the pipeline names no registered strategy.
    """
    strategy = strategy_of(pipeline)
    components = [component for component, _ in pipeline.walk()]
    answers = outputs.get(strategy.answer_component, {}).get("answers") or []
    answer = answers[0] if answers else GeneratedAnswer(data=UNKNOWN, query=query, documents=[], meta={})
    voter = _outputs_of(strategy, "post_fusion", outputs) or {}
    voter_answers = voter.get("answers") or []
    summarizer = _outputs_of(strategy, "summaries", outputs) or {}
    evidence: dict[str, Any] = {
        "components_run": [component for component in components if component in outputs],
        "votes": voter_answers[0].meta.get("votes") if voter_answers else None,
        "candidates": summarizer.get("candidates") if summarizer else voter.get("candidates"),
    }
    if summarizer:
        evidence["summaries"] = summarizer.get("summaries")
        evidence["label_summaries"] = sum(
            summary_is_label(summary, summarizer.get("candidates") or []) for summary in evidence["summaries"] or []
        )
        if rejected := (summarizer.get("meta") or {}).get("invalid_candidates"):
            evidence["invalid_candidates"] = len(rejected)
    if voter_answers:
        evidence["vote_share"] = voter_answers[0].meta.get("vote_share")
    if (notes := _outputs_of(strategy, "notes", outputs)) is not None:
        evidence["notes"] = notes.get("notes")
        evidence["answer_source"] = answer.meta.get("answer_source")
    if _outputs_of(strategy, "verification", outputs) is not None:
        evidence["scores"] = [
            {key: a.meta.get(key) for key in ("candidate_index", "validity", "ranking", "score")} for a in answers
        ]
    fallback = _outputs_of(strategy, "concatenation", outputs)
    if fallback is not None:
        evidence["fallback"] = "unknown" in fallback
        evidence["stages"] = stage_trace(strategy.stages, outputs)
        answer.meta.update(stage=evidence["stages"][-1]["stage"], stages=evidence["stages"])
    for item in answers:
        if "confidence" not in item.meta and (confidence := answer_confidence(item.meta, item.data)) is not None:
            item.meta["confidence"] = confidence
    evidence["confidence"] = answer.meta.get("confidence")
    if answer.meta.get("finish_reason") is not None:  # the answer is one reply's: did the token cap cut it?
        evidence["finish_reason"] = answer.meta["finish_reason"]
    if is_invalid(answer.meta):
        evidence.update({key: answer.meta.get(key) for key in ("answer_source", "invalid_reason", "rejected_answer")})
    if voter_answers and voter_answers[0].meta.get("invalid_answers"):
        evidence["invalid_answers"] = voter_answers[0].meta["invalid_answers"]
    if failures := pipeline_failures(pipeline, outputs):
        evidence["failures"] = failures
        if fallback is not None:  # the answer of a later stage says which calls failed, the earlier stages' included
            answer = dataclasses.replace(answer, meta={**answer.meta, "failures": failures})
            answers = [answer, *answers[1:]] if answers else answers
    return StrategyRun(
        answer=answer,
        answers=answers,
        documents=outputs.get(RETRIEVER, {}).get("documents") or [],
        evidence=evidence,
        usage=pipeline_usage(pipeline, outputs),
        seconds=seconds,
        strategy=strategy.name,
    )
