"""How a strategy's run reads to a person: status lines per round, answer, evidence and sources as plain text and as
Markdown. Components are found through `Strategy.stages`, never by name."""

from __future__ import annotations

import html
import re
from typing import Any

from haystack import Document, Pipeline

from haystack_fusion.strategies import RETRIEVER, SPLIT_ROUTER, StageResult, StrategyRun, get_strategy, strategy_of
from haystack_fusion.strategies.run import (
    cited_sources,
    evidence_line,
    excerpt,
    passages,
    rounded,
    source_title,
    supporting_ids,
)

_MARKDOWN_PUNCTUATION = re.compile(r"([\\`*_{}\[\]#+\-!|~$=^])")  # CommonMark reads it escaped as itself


def plural(count: int, noun: str) -> str:
    """ "1 LLM call", "3 LLM calls"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _markdown(text: str | None) -> str:
    """Text a Markdown renderer shows as it is."""
    escaped = _MARKDOWN_PUNCTUATION.sub(r"\\\1", html.escape(text or "", quote=False))
    return "\n".join(line.lstrip() for line in escaped.splitlines())


def _stage_text(stage: StageResult) -> str:
    """E.g. "concatenation: passed on (unknown answer)"."""
    reason = f" ({stage.reason})" if stage.reason else ""
    return f"{stage.stage}: {'answered' if stage.answered else 'passed on'}{reason}"


def _usage_text(run: StrategyRun) -> str:
    """E.g. "6 LLM calls in 2 rounds, 900 prompt + 12 completion tokens, 4.2 s", then `_by_model`'s."""
    usage, cached = run.usage, run.usage.cached_calls
    if usage.from_cache:
        return f"answered from the cache: {plural(usage.calls, 'earlier LLM call')} reused, no LLM call made"
    return (
        f"{plural(usage.calls, 'LLM call')}{f' ({cached} from the cache)' if cached else ''} in "
        f"{plural(usage.rounds or 0, 'round')}, "
        f"{usage.prompt_tokens} prompt + {usage.completion_tokens} completion tokens, "
        f"{run.seconds:.1f} s{_by_model(run)}"
    )


def _by_model(run: StrategyRun) -> str:
    """E.g. "; small: 5 calls, 900 + 8 tokens; strong: ..."; "" for one model."""
    if len(run.usage_by_model) < 2:
        return ""
    return "".join(
        f"; {model}: {plural(used.calls, 'call')}, {used.prompt_tokens} + {used.completion_tokens} tokens"
        for model, used in run.usage_by_model.items()
    )


def format_run(question: str, run: StrategyRun, *, passage_chars: int = 160) -> str:
    """One answered question as plain text for the terminal (`haystack-fusion ask`)."""
    evidence, usage = run.evidence, run.usage
    lines = [
        f"Question: {question}",
        f"Strategy: {run.strategy} ({get_strategy(run.strategy).source})",
        f"Answer:   {run.answer_text()}",
        f"Evidence: {evidence_line(run) or 'single LLM round'}",
    ]
    if evidence.confidence is not None:
        lines.append(f"Confidence: {evidence.confidence:.2f}")
    if stages := evidence.stages:
        trace = [f"{stage.stage} ({stage.reason})" for stage in stages if not stage.answered]
        trace.append(f"{stages[-1].stage} answered")
        lines.append(f"Stages:   {' -> '.join(trace)}")
    lines.append(f"Sources (top-{len(run.documents)}):")
    for rank, document in enumerate(run.documents, start=1):
        score = f"{document.score:.2f}" if document.score is not None else "-"
        text = excerpt(document.content, passage_chars)
        lines.append(f"  [{rank}] {source_title(document)} (score {score}) {text}")
    lines.append(
        f"LLM: {plural(usage.calls, 'call')} ({usage.failed_calls} failed) in {plural(usage.rounds or 0, 'round')}, "
        f"{usage.prompt_tokens} prompt + {usage.completion_tokens} completion tokens{_by_model(run)}"
    )
    lines.append(f"Time: {run.seconds:.2f} s")
    return "\n".join(lines)


def evidence_markdown(run: StrategyRun, *, chars: int = 300) -> str:
    """The sources and evidence as Markdown (a streamed chat reply's details block)."""
    evidence, supporting, parts = run.evidence, supporting_ids(run), []
    if evidence.standalone_question:
        parts += [f"**Question** (from the chat): {_markdown(evidence.standalone_question)}", ""]
    parts += ["**Sources**", ""]
    for index, document in enumerate(passages(run), start=1):
        label = "supported the answer" if document.id in supporting else "retrieved"
        text = _markdown(excerpt(document.content, chars))
        parts.append(f"{index}. **{_markdown(source_title(document))}** ({label}) {text}")
    if evidence.stages:
        parts += ["", "**Stages**", "", *(f"- {_stage_text(stage)}" for stage in evidence.stages)]
    if evidence.votes:
        parts += ["", "**Votes**: " + ", ".join(f"{_markdown(a)} {n}" for a, n in evidence.votes.items())]
    if evidence.candidates:
        parts += ["", "**Candidates**: " + ", ".join(_markdown(str(c)) for c in evidence.candidates)]
    if evidence.sure is not None and evidence.sure.scores:
        parts += ["", "**Scores** (validity + ranking)", ""]
        parts += [
            f"- candidate {s.candidate_index}: validity {rounded(s.validity)}, ranking {rounded(s.ranking)}, score "
            f"{rounded(s.score)}"
            for s in evidence.sure.scores
        ]
    if evidence.notes is not None and evidence.notes.notes:
        parts += ["", "**Notes**", ""]
        parts += [
            f"{i}. ({note.get('relevance')}) {_markdown(excerpt(note.get('note'), chars))}"
            for i, note in enumerate(evidence.notes.notes, start=1)
        ]
    return "\n".join([*parts, "", f"**Usage**: {_usage_text(run)}"])


def evidence_summary(run: StrategyRun) -> str:
    """The title of the evidence block, e.g. "Sources and evidence (1 LLM call)", or "... (from the cache)"."""
    if run.usage.from_cache:
        return "Sources and evidence (from the cache)"
    return f"Sources and evidence ({plural(run.usage.calls, 'LLM call')})"


def answered_text(run: StrategyRun) -> str:
    """The line ending a streamed reply, e.g. "Answered in 4.2 s: 2 of 5 passages support it"."""
    if run.usage.from_cache:
        return "Answered from the cache (no LLM call made)"
    read, supporting = passages(run), supporting_ids(run)
    held = sum(document.id in supporting for document in read)
    return f"Answered in {run.seconds:.1f} s: {held} of {plural(len(read), 'passage')} support it"


def source_event_data(document: Document, index: int) -> dict[str, Any]:
    """One passage (the reply's `index`-th source, from 1) in Open WebUI's citation shape."""
    name = source_title(document)
    return {
        "source": {"name": name, "id": document.id},
        "document": [document.content or ""],
        "metadata": [{"source": name, "document_id": document.id, "index": index, "score": rounded(document.score)}],
    }


def evidence_element_props(run: StrategyRun, *, chars: int = 300) -> dict[str, Any]:
    """The props of the chat UI's `FusionEvidence` element (JSON values)."""
    supporting = supporting_ids(run)
    return {
        "summary": evidence_summary(run),
        "sources": [
            {
                "index": index,
                "title": source_title(document),
                "excerpt": excerpt(document.content, chars),
                "score": rounded(document.score),
                "supporting": document.id in supporting,
            }
            for index, document in enumerate(passages(run), start=1)
        ],
        "stages": [_stage_text(stage) for stage in run.evidence.stages],
        "evidence": evidence_line(run),
        "usage": _usage_text(run),
    }


def api_result(run: StrategyRun) -> dict[str, Any]:
    """The served `/{name}/run` JSON."""
    sources = [
        {"id": d.id, "title": (d.meta or {}).get("title"), "content": d.content, "score": d.score}
        for d in cited_sources(run)
    ]
    return {
        "answer": run.answer.data,
        "sources": sources,
        "evidence": run.evidence.to_dict(),
        "usage": run.usage.to_dict(),
        "usage_by_model": {model: usage.to_dict() for model, usage in run.usage_by_model.items()},
    }


def streamed_component(pipeline: Pipeline) -> str | None:
    """The component whose tokens are the answer (a last `answer` stage without concatenation, or per-document
    `notes`); None for votes and selections."""
    stages = strategy_of(pipeline).stages
    if not stages or any(stage.kind == "concatenation" for stage in stages):
        return None
    last = stages[-1]
    if last.kind == "notes" and getattr(pipeline.get_component(last.component), "mode", None) != "per_document":
        return None
    return last.component if last.kind in ("answer", "notes") else None


_ROUND_STARTS = {  # by the first stage's kind
    "answer": "Reading the {k} passages together",
    "concatenation": "Concatenation: reading the {k} passages together",
    "post_fusion": "Post-fusion: reading the {k} passages one by one",
    "summaries": "SuRe: proposing answer candidates from the {k} passages, then a summary for each",
    "notes": "Chain-of-Note: writing a reading note on each of the {k} passages",
}


def round_start(pipeline: Pipeline, k: int) -> str:
    """The status line of the strategy's first round over `k` passages."""
    stages = strategy_of(pipeline).stages
    kind = stages[0].kind if stages else "answer"
    if kind == "summaries" and getattr(pipeline.get_component(stages[0].component), "mode", None) == "generic":
        return f"Summarizing the {k} passages"
    return _ROUND_STARTS.get(kind, _ROUND_STARTS["notes"]).format(k=k)


def narrate(
    component: str, output: dict[str, Any], pipeline: Pipeline, state: dict[str, Any]
) -> list[tuple[str, bool]]:
    """(text, done) status lines for the rounds a component's output ends and starts; `state` lives for one run."""
    if component == RETRIEVER:
        state["k"] = k = len(output.get("documents") or [])
        return [(f"Retrieved {plural(k, 'passage')}", True), (round_start(pipeline, k), False)]
    if "split_reason" in output:  # cascade's SplitVoteRouter sent the vote on
        return [
            (f"Post-fusion vote split ({output['split_reason']})", True),
            (f"SuRe: verifying the top {len(output['split_candidates'])} candidates with a summary each", False),
        ]
    stages = strategy_of(pipeline).stages
    voter = next((stage.component for stage in stages if stage.kind == "post_fusion"), None)
    if component == SPLIT_ROUTER:  # its decided vote is the voter's, told once the router has let it through
        component = voter or component
    elif component == voter and SPLIT_ROUTER in dict(pipeline.walk()):
        return []
    index = next((i for i, stage in enumerate(stages) if stage.component == component), None)
    if index is None:
        return []
    kind, after = stages[index].kind, stages[index + 1].kind if index + 1 < len(stages) else None
    answers = output.get("answers") or []
    if kind == "concatenation":
        if "known" in output:
            return [("Concatenation answered", True)]
        reason = output.get("reason") or "unknown answer"
        why = {"unknown answer": "answered unknown", "no reply": "failed"}.get(reason, f"was unsure ({reason})")
        return [(f"Concatenation {why}: reading the {state.get('k', 0)} passages one by one", False)]
    if kind == "post_fusion":
        votes = answers[0].meta.get("votes") or {} if answers else {}
        if output.get("unknown") or not votes:
            return [("Post-fusion: every passage answered unknown", True)]
        ended = f"Post-fusion: {answers[0].data} won {next(iter(votes.values()), 0)} of "
        ended += plural(sum(votes.values()), "vote")
        if after != "answer":
            return [(ended, True)]
        pool = plural(len(output.get("candidates") or []), "candidate")  # PF+Concat: the distiller round follows
        return [
            (ended, True),
            (f"Distilling {pool} from {plural(len(output.get('documents') or []), 'passage')}", False),
        ]
    if kind == "summaries":
        candidates = output.get("candidates") or []
        lines = [(f"Summaries written for {plural(len(candidates), 'candidate')}: {', '.join(candidates)}", True)]
        following = {
            "verification": "SuRe: judging each summary's validity and ranking them pair-wise",
            "answer": "Answering from the summaries",
        }
        return lines + ([(following[after], False)] if after in following else [])
    if kind == "verification":
        return [(f"SuRe picked {answers[0].data if answers else 'unknown'} (validity + pair-wise ranking)", True)]
    if kind == "notes":
        notes = output.get("notes") or []
        relevant = sum(1 for note in notes if note.get("relevance") in ("direct", "context"))
        return [(f"Chain-of-Note: {relevant} of {plural(len(notes), 'passage')} relevant", True)]
    return [("Answer written", True)]
