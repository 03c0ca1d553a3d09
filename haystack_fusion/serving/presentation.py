"""
How a strategy's run reads to a person: its stages as status lines, its evidence and its sources.

Used by `haystack-fusion ask` and the served wrappers; components are read from `Strategy.stages`, never by name.
"""

from __future__ import annotations

import html
import re
import textwrap
from typing import Any

from haystack import Document, Pipeline

from haystack_fusion.answers import UnknownDetector, normalize_answer
from haystack_fusion.strategies import RETRIEVER, SPLIT_ROUTER, Stage, Strategy, StrategyRun, get_strategy, strategy_of
from haystack_fusion.validation import is_invalid


def plural(count: int, noun: str) -> str:
    """`count` and `noun`, the noun with an "s" unless the count is 1: "1 LLM call", "3 LLM calls"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def excerpt(text: str | None, chars: int) -> str:
    """`text` with its whitespace collapsed, shortened at a word boundary to at most `chars` characters (" ...")."""
    return textwrap.shorten(text or "", width=chars, placeholder=" ...")


_MARKDOWN_PUNCTUATION = re.compile(r"([\\`*_{}\[\]#+\-!|~$=^])")
"""ASCII punctuation that starts Markdown structure; CommonMark reads it backslash-escaped as itself."""


def plain_markdown(text: str | None) -> str:
    """
    Text a Markdown renderer shows as it is: HTML escaped (no `</details>` can close the block), Markdown punctuation
    backslash-escaped, leading indentation dropped (no indented code block).
    """
    escaped = html.escape(text or "", quote=False)
    escaped = _MARKDOWN_PUNCTUATION.sub(r"\\\1", escaped)
    return "\n".join(line.lstrip() for line in escaped.splitlines())


_DETECTOR = UnknownDetector()


def supporting_ids(run: StrategyRun) -> set[str]:
    """
    The ids of the passages that supported the answer: a post-fusion vote's winning voters and those whose text
    contains it (SQuAD-normalized). Empty for an unknown, empty or rejected answer.
    """
    answer = run.answer
    text = normalize_answer(answer.data or "")
    if not text or _DETECTOR.is_unknown(answer.data) or is_invalid(answer.meta):
        return set()
    voters = {document.id for document in answer.documents or []} if answer.meta.get("votes") is not None else set()
    passages = [*run.documents, *(answer.documents or [])]
    return voters | {d.id for d in passages if f" {text} " in f" {normalize_answer(d.content or '')} "}


def passages(run: StrategyRun) -> list[Document]:
    """Every passage the run read: the retrieved ones in rank order, then any other passage the answer came from."""
    retrieved = {document.id for document in run.documents}
    return [*run.documents, *(d for d in run.answer.documents or [] if d.id not in retrieved)]


def sources(run: StrategyRun) -> list[Document]:
    """The passages a reply cites, in `passages` order: the supporting ones, else every retrieved one."""
    supporting = supporting_ids(run)
    return [d for d in passages(run) if d.id in supporting] or list(run.documents)


def sources_text(run: StrategyRun, *, chars: int = 200) -> str:
    """The answer's supporting passages (else the retrieved ones) as numbered lines "[i] title: text"."""
    lines = []
    for index, document in enumerate(sources(run), start=1):
        title = (document.meta or {}).get("title")
        text = excerpt(document.content, chars)
        lines.append(f"[{index}] {title}: {text}" if title else f"[{index}] {text}")
    return "\n".join(lines)


def source_title(document: Document) -> str:
    """`meta["title"]`, else `meta["file"]`, else "passage " and the first 8 characters of the id."""
    meta = document.meta or {}
    return meta.get("title") or meta.get("file") or f"passage {document.id[:8]}"


def display_score(score: float | None) -> float | None:
    """A score as it is shown: rounded to 2 decimals (None stays None)."""
    return None if score is None else round(float(score), 2)


def source_event_data(document: Document, index: int) -> dict[str, Any]:
    """
    One passage in Open WebUI's citation shape (`hayhooks.open_webui.create_source_event`).

    :param index: Its place among the reply's sources, from 1.
    :returns: `source` (`name`: `source_title`, `id`), `document` (the passage text, one item), `metadata` (`source`,
        `document_id`, `index`, `score`: the retriever's rounded to 2 decimals, None when it gives none).
    """
    name = source_title(document)
    return {
        "source": {"name": name, "id": document.id},
        "document": [plain_markdown(document.content)],
        "metadata": [
            {"source": name, "document_id": document.id, "index": index, "score": display_score(document.score)}
        ],
    }


def evidence_line(run: StrategyRun) -> str:
    """The evidence (fallback, votes, SuRe scores or candidates, notes) joined by " | ", else "single LLM round"."""
    parts = []
    if "fallback" in run.evidence:
        parts.append(f"fallback fired: {'yes' if run.evidence['fallback'] else 'no'}")
    if run.evidence.get("votes") is not None:
        votes = ", ".join(f"{answer!r}: {count}" for answer, count in run.evidence["votes"].items())
        parts.append(f"votes: {{{votes}}}" if votes else "votes: none (every passage said unknown)")
    if run.evidence.get("scores"):
        scores = ", ".join(
            f"{answer.data!r}: v={_number(answer.meta.get('validity'))} r={_number(answer.meta.get('ranking'))}"
            for answer in run.answers
        )
        parts.append(f"SuRe scores: {scores}")
    elif run.evidence.get("candidates") is not None and run.evidence.get("votes") is None:
        parts.append(f"candidates: {run.evidence['candidates']}")
    if run.evidence.get("notes") is not None:
        relevance = ", ".join(f"[{i}] {note['relevance']}" for i, note in enumerate(run.evidence["notes"], start=1))
        parts.append(f"notes: {relevance or 'none'}; answer from {run.evidence.get('answer_source')}")
    return " | ".join(parts) or "single LLM round"


def _number(value: Any) -> Any:
    """A score as shown: a float rounded to 2 decimals; anything else as it is."""
    return round(value, 2) if isinstance(value, float) else value


def stages_line(stages: list[dict[str, Any]]) -> str:
    """A fallback strategy's stage trace on one line, e.g. "concatenation (unknown answer) -> post_fusion answered"."""
    parts = [f"{stage['stage']} ({stage.get('reason')})" for stage in stages if not stage.get("answered")]
    return " -> ".join([*parts, f"{stages[-1]['stage']} answered"])


def usage_line(run: StrategyRun) -> str:
    """LLM calls (failed), rounds and tokens, e.g. "LLM: 6 calls (0 failed) in 2 rounds, ..."."""
    usage = run.usage
    return (
        f"LLM: {plural(usage['calls'], 'call')} ({usage['failed_calls']} failed) in "
        f"{plural(usage.get('rounds', 0), 'round')}, "
        f"{usage['prompt_tokens']} prompt + {usage['completion_tokens']} completion tokens"
    )


def format_run(question: str, run: StrategyRun, *, passage_chars: int = 160) -> str:
    """
    Render one answered question for the terminal (`haystack-fusion ask`).

    :param passage_chars: How much of each source passage to show, in characters.
    :returns: Lines: question, strategy, answer, evidence, confidence and stages (when any), sources, usage, time.
    """
    lines = [
        f"Question: {question}",
        f"Strategy: {run.strategy} ({get_strategy(run.strategy).source})",
        f"Answer:   {run.answer_text()}",
        f"Evidence: {evidence_line(run)}",
    ]
    if run.evidence.get("confidence") is not None:
        lines.append(f"Confidence: {run.evidence['confidence']:.2f}")
    if run.evidence.get("stages"):
        lines.append(f"Stages:   {stages_line(run.evidence['stages'])}")
    lines.append(f"Sources (top-{len(run.documents)}):")
    for rank, document in enumerate(run.documents, start=1):
        title = source_title(document)
        score = f"{document.score:.2f}" if document.score is not None else "-"
        text = excerpt(document.content, passage_chars)
        lines.append(f"  [{rank}] {title} (score {score}) {text}")
    lines.append(usage_line(run))
    lines.append(f"Time: {run.seconds:.2f} s")
    return "\n".join(lines)


def evidence_markdown(run: StrategyRun, *, chars: int = 300) -> str:
    """
    The sources and the strategy's evidence as markdown, for the chat reply's collapsible details block.

    :returns: The passages read (each shortened to `chars` characters), then stages, votes, candidates, scores and
        notes when the run has them, and usage.
    """
    evidence = run.evidence
    parts = []
    if evidence.get("standalone_question"):
        parts += [f"**Question** (from the chat): {plain_markdown(evidence['standalone_question'])}", ""]
    parts += ["**Sources**", ""]
    supporting = supporting_ids(run)
    for index, document in enumerate(passages(run), start=1):
        label = "supported the answer" if document.id in supporting else "retrieved"
        text = plain_markdown(excerpt(document.content, chars))
        parts.append(f"{index}. **{plain_markdown(source_title(document))}** ({label}) {text}")
    if evidence.get("stages"):
        parts += ["", "**Stages**", ""]
        parts += [f"- {stage_text(stage)}" for stage in evidence["stages"]]
    if evidence.get("votes"):
        votes = ", ".join(f"{plain_markdown(answer)} {count}" for answer, count in evidence["votes"].items())
        parts += ["", "**Votes**: " + votes]
    if evidence.get("candidates"):
        parts += ["", "**Candidates**: " + ", ".join(plain_markdown(str(c)) for c in evidence["candidates"])]
    if evidence.get("scores"):
        parts += ["", "**Scores** (validity + ranking)", ""]
        parts += [
            f"- candidate {s.get('candidate_index')}: validity {_number(s.get('validity'))}, ranking "
            f"{_number(s.get('ranking'))}, score {_number(s.get('score'))}"
            for s in evidence["scores"]
        ]
    if evidence.get("notes"):
        parts += ["", "**Notes**", ""]
        for i, note in enumerate(evidence["notes"], start=1):
            text = plain_markdown(excerpt(note.get("note"), chars))
            parts.append(f"{i}. ({note.get('relevance')}) {text}")
    parts += ["", f"**Usage**: {usage_text(run)}"]
    return "\n".join(parts)


def stage_text(stage: dict[str, Any]) -> str:
    """One stage of a fallback strategy's trace (`evidence["stages"]`): "concatenation: passed on (unknown answer)"."""
    return f"{stage['stage']}: {'answered' if stage['answered'] else 'passed on'}" + (
        f" ({stage['reason']})" if stage.get("reason") else ""
    )


def _from_cache(usage: dict[str, int]) -> bool:
    """Whether every LLM call of a run was answered from the embedded model's reply cache."""
    return bool(usage.get("calls")) and usage.get("cached_calls", 0) >= usage["calls"]


def usage_text(run: StrategyRun) -> str:
    """LLM calls, rounds, tokens and time, e.g. "6 LLM calls in 2 rounds, 900 prompt + 12 completion tokens, 4.2 s"."""
    usage = run.usage
    calls = usage.get("calls", 0)
    cached = usage.get("cached_calls", 0)
    if _from_cache(usage):
        return f"answered from the cache: {plural(calls, 'earlier LLM call')} reused, no LLM call made"
    return (
        f"{plural(calls, 'LLM call')}{f' ({cached} from the cache)' if cached else ''} in "
        f"{plural(usage.get('rounds', 0), 'round')}, "
        f"{usage.get('prompt_tokens', 0)} prompt + {usage.get('completion_tokens', 0)} completion tokens, "
        f"{run.seconds:.1f} s"
    )


def evidence_summary(run: StrategyRun) -> str:
    """The title of the evidence block, e.g. "Sources and evidence (1 LLM call)", or "... (from the cache)"."""
    if _from_cache(run.usage):
        return "Sources and evidence (from the cache)"
    return f"Sources and evidence ({plural(run.usage.get('calls', 0), 'LLM call')})"


def answered_text(run: StrategyRun) -> str:
    """The line ending a streamed reply, e.g. "Answered in 4.2 s: 2 of 5 passages support it"."""
    if _from_cache(run.usage):
        return "Answered from the cache (no LLM call made)"
    read, supporting = passages(run), supporting_ids(run)
    held = sum(document.id in supporting for document in read)
    return f"Answered in {run.seconds:.1f} s: {held} of {plural(len(read), 'passage')} support it"


def evidence_element_props(run: StrategyRun, *, chars: int = 300) -> dict[str, Any]:
    """
    The props of the chat UI's `FusionEvidence` element.

    :param chars: How much of each passage to show, in characters.
    :returns: A JSON-serializable dict: `summary`, `sources` (one per passage of `passages`: `index`, `title`,
        `excerpt`, `score` rounded to 2 decimals or None, `supporting`), `stages`, `evidence` (empty for a single LLM
        round) and `usage`.
    """
    supporting = supporting_ids(run)
    line = evidence_line(run)
    return {
        "summary": evidence_summary(run),
        "sources": [
            {
                "index": index,
                "title": source_title(document),
                "excerpt": excerpt(document.content, chars),
                "score": display_score(document.score),
                "supporting": document.id in supporting,
            }
            for index, document in enumerate(passages(run), start=1)
        ],
        "stages": [stage_text(stage) for stage in run.evidence.get("stages") or []],
        "evidence": "" if line == "single LLM round" else line,
        "usage": usage_text(run),
    }


def chat_text(run: StrategyRun) -> str:
    """The answer and its sources as plain text: what a chat client that does not stream reads."""
    return f"{run.answer_text()}\n\nSources:\n{sources_text(run)}"


def api_result(run: StrategyRun) -> dict[str, Any]:
    """
    A run as JSON for the served `/{name}/run` route.

    :returns: `answer` (text), `sources` (each `id`, `title`, `content`, `score`), `evidence` and `usage`.
    """
    return {
        "answer": run.answer.data,
        "sources": [
            {"id": d.id, "title": (d.meta or {}).get("title"), "content": d.content, "score": d.score}
            for d in sources(run)
        ],
        "evidence": run.evidence,
        "usage": run.usage,
    }


def _stage_of(strategy: Strategy, component: str) -> tuple[Stage | None, Stage | None]:
    """The stage the component runs (None for any other component) and the stage after it (None when it is last)."""
    for index, stage in enumerate(strategy.stages):
        if stage.component == component:
            following = strategy.stages[index + 1] if index + 1 < len(strategy.stages) else None
            return stage, following
    return None, None


def streamed_component(pipeline: Pipeline) -> str | None:
    """
    The component whose tokens are the answer, streamed as they come; None when no single final call writes it.

    That is the last stage when it is `answer` (and no `concatenation` stage may still pass the question on) or
    per-document `notes` (its synthesis call); None for votes and selections (post-fusion, SuRe).
    """
    stages = strategy_of(pipeline).stages
    if not stages or any(stage.kind == "concatenation" for stage in stages):
        return None
    last = stages[-1]
    if last.kind == "answer":
        return last.component
    if last.kind == "notes":
        mode = getattr(pipeline.get_component(last.component), "mode", None)
        return last.component if mode == "per_document" else None
    return None


def round_start(pipeline: Pipeline, k: int) -> str:
    """The status line of the first round of the pipeline's strategy, which starts once `k` passages are retrieved."""
    stages = strategy_of(pipeline).stages
    first = stages[0] if stages else None
    if first is None or first.kind == "answer":
        return f"Reading the {k} passages together"
    if first.kind == "concatenation":
        return f"Concatenation: reading the {k} passages together"
    if first.kind == "post_fusion":
        return f"Post-fusion: reading the {k} passages one by one"
    if first.kind == "summaries":
        if getattr(pipeline.get_component(first.component), "mode", None) == "generic":
            return f"Summarizing the {k} passages"
        return f"SuRe: proposing answer candidates from the {k} passages, then a summary for each"
    return f"Chain-of-Note: writing a reading note on each of the {k} passages"


def narrate(
    component: str, output: dict[str, Any], pipeline: Pipeline, state: dict[str, Any]
) -> list[tuple[str, bool]]:
    """
    Status lines for one component's output while a strategy runs: the round it ends and the round it starts.

    :param state: Kept between calls of one run (the number of retrieved passages).
    :returns: (text, done) pairs, done True for a round that ended; empty for a component that is no stage.
    """
    if component == RETRIEVER:
        state["k"] = k = len(output.get("documents") or [])
        return [(f"Retrieved {plural(k, 'passage')}", True), (round_start(pipeline, k), False)]
    k = state.get("k", 0)
    if "split_reason" in output:  # cascade's SplitVoteRouter sent the vote on
        return [
            (f"Post-fusion vote split ({output['split_reason']})", True),
            (f"SuRe: verifying the top {len(output['split_candidates'])} candidates with a summary each", False),
        ]
    strategy = strategy_of(pipeline)
    routed = SPLIT_ROUTER in dict(pipeline.walk())
    if component == SPLIT_ROUTER:  # its decided vote is the voter's, told once the router has let it through
        component = next(stage.component for stage in strategy.stages if stage.kind == "post_fusion")
    elif routed and any(stage.kind == "post_fusion" and stage.component == component for stage in strategy.stages):
        return []
    stage, following = _stage_of(strategy, component)
    if stage is None:
        return []
    if stage.kind == "concatenation":
        if "known" in output:
            return [("Concatenation answered", True)]
        reason = output.get("reason") or "unknown answer"
        why = {"unknown answer": "answered unknown", "no reply": "failed"}.get(reason, f"was unsure ({reason})")
        return [(f"Concatenation {why}: reading the {k} passages one by one", False)]
    if stage.kind == "post_fusion":
        answers = output.get("answers") or []
        votes = answers[0].meta.get("votes") or {} if answers else {}
        if output.get("unknown") or not votes:
            return [("Post-fusion: every passage answered unknown", True)]
        ended = f"Post-fusion: {answers[0].data if answers else 'unknown'} won {next(iter(votes.values()), 0)} of "
        ended += plural(sum(votes.values()), "vote")
        if following is not None and following.kind == "answer":  # PF+Concat: the distiller round follows
            answering = len(output.get("documents") or [])
            pool = plural(len(output.get("candidates") or []), "candidate")
            return [(ended, True), (f"Distilling {pool} from {plural(answering, 'passage')}", False)]
        return [(ended, True)]
    if stage.kind == "summaries":
        candidates = output.get("candidates") or []
        lines = [(f"Summaries written for {plural(len(candidates), 'candidate')}: {', '.join(candidates)}", True)]
        if following is not None and following.kind == "verification":
            lines.append(("SuRe: judging each summary's validity and ranking them pair-wise", False))
        elif following is not None and following.kind == "answer":
            lines.append(("Answering from the summaries", False))
        return lines
    if stage.kind == "verification":
        answers = output.get("answers") or []
        return [(f"SuRe picked {answers[0].data if answers else 'unknown'} (validity + pair-wise ranking)", True)]
    if stage.kind == "notes":
        notes = output.get("notes") or []
        relevant = sum(1 for note in notes if note.get("relevance") in ("direct", "context"))
        return [(f"Chain-of-Note: {relevant} of {plural(len(notes), 'passage')} relevant", True)]
    return [("Answer written", True)]
