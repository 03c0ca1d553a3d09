"""Training-data export: a run's Chain-of-Note notes as chat fine-tuning JSONL (Yu et al., section 2.3.2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from haystack import Document

from haystack_fusion.evaluation.datasets import EvalDataset
from haystack_fusion.evaluation.records import RESULTS_FILE, merge_evidence, read_evidence_text, read_records
from haystack_fusion.prompts import DEFAULT_MAX_PASSAGE_CHARS, single_call_prompt
from haystack_fusion.prompts.chain_of_note import ANSWER_LEAD


def training_record(query: str, documents: list[Document], notes: list[dict[str, Any]], answer: str, *,
                    allow_parametric_knowledge: bool = True,
                    max_passage_chars: int | None = DEFAULT_MAX_PASSAGE_CHARS) -> dict[str, Any]:  # fmt: skip
    """One chat fine-tuning example for distilling Chain-of-Note (Yu et al., section 2.3.2) from the question, its k
    passages, their notes (empty ones left out) and the final answer; `max_passage_chars` in characters.
    :returns: `{"messages": [user, assistant]}` (OpenAI chat fine-tuning format): the single-call prompt, then the
        notes and the answer in Table 6's format."""
    prompt = single_call_prompt(query, documents, allow_parametric_knowledge=allow_parametric_knowledge,
                                max_passage_chars=max_passage_chars)  # fmt: skip
    texts = [(index, " ".join(str(note.get("note") or "").split())) for index, note in enumerate(notes, start=1)]
    written = [text if f"#{index}" in text else f"Passage #{index}: {text}" for index, text in texts if text]
    target = " ".join([*written, f"{ANSWER_LEAD} {answer}"])
    return {"messages": [{"role": "user", "content": prompt[0].text}, {"role": "assistant", "content": target}]}


def export_notes(run: str | Path, dataset: EvalDataset, path: str | Path, *, correct_only: bool = False,
                 allow_parametric_knowledge: bool = True,
                 max_passage_chars: int | None = DEFAULT_MAX_PASSAGE_CHARS) -> int:  # fmt: skip
    """Write the Chain-of-Note records of an `eval --out` folder `run` (those with kept note texts) as chat fine-tuning
    examples (`training_record`), one JSON object per line, to `path` (overwritten).
    :param correct_only: Keep only right predictions (EM, or "unknown" on unanswerable questions).
    :param allow_parametric_knowledge: Which step 5 the prompts state; `max_passage_chars`: match the run's settings.
    :returns: The number of examples written. :raises KeyError: For a question or passage id not in `dataset`."""
    questions, documents = {q.id: q for q in dataset.questions}, {d.id: d for d in dataset.documents}
    texts = read_evidence_text(Path(run))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with path.open("w", encoding="utf-8") as file:
        for record in read_records(Path(run) / RESULTS_FILE):
            notes = merge_evidence(record.evidence, texts[record.key()]).get("notes") if record.key() in texts else None
            correct = record.score.em > 0 if record.answerable else record.score.unknown
            if notes is None or (correct_only and not correct):
                continue
            example = training_record(questions[record.question_id].question,
                                      [documents[document_id] for document_id in record.passages], notes,
                                      record.prediction, allow_parametric_knowledge=allow_parametric_knowledge,
                                      max_passage_chars=max_passage_chars)  # fmt: skip
            file.write(json.dumps(example, ensure_ascii=False) + "\n")
            written += 1
    return written
