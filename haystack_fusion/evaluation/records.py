"""Evaluation records: a run folder holds `results.jsonl` (a `QuestionRecord` per answered question: ids and scores,
no dataset text), `evidence_text.jsonl` (model text that may quote passages; git-ignored) and `run.json`."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from haystack import Pipeline
from haystack.core.errors import SerializationError
from haystack.core.serialization import component_to_dict

from haystack_fusion.evaluation.metrics import QuestionScore
from haystack_fusion.prompts import PROMPTS

RESULTS_FILE = "results.jsonl"
CLOSED_BOOK_FILE = "closed_book.jsonl"
EVIDENCE_TEXT_FILE = "evidence_text.jsonl"
RUN_FILE = "run.json"
"""A run folder's manifest: report title, dataset, command, strategy options, prices."""
TEXT_EVIDENCE_KEYS = ("summaries",)
"""Evidence keys whose values are model text that may quote passages: kept out of the records."""
NOTE_TEXT_KEY = "note"
"""The free-text field of a Chain-of-Note note (its `relevance` label stays in the record)."""
RUNTIME_SETTINGS = ("max_concurrency", "max_calls_in_flight", "n_threads", "n_threads_batch", "verbose", "timeout",
                    "max_retries", "logprobs", "top_logprobs", "api_base_url", "index")  # fmt: skip
"""Init parameters that change speed, what a reply reports or where a model or store is reached, not predictions:
not fingerprinted, so a run resumes with other values of them."""


@dataclass
class QuestionRecord:
    """One line of `results.jsonl`: a question answered by a `strategy` at a `top_k` in a `setting` (`PassageSetting
    .label()`). `evidence`: without free text (`split_evidence`); `passages`: the ids shown, in rank order;
    `fingerprint`: `run_fingerprint`; `redacted`: text was cut out, so rescoring keeps `score`; `error`: what failed."""

    strategy: str
    top_k: int
    setting: str
    question_id: str
    answerable: bool
    prediction: str
    evidence: dict[str, Any]
    passages: list[str]
    score: QuestionScore
    fingerprint: str = ""
    redacted: bool = False
    error: str | None = None

    @property
    def failed(self) -> bool:
        """Whether this is a failed record (`error` set): skipped by `read_records`, asked again on resume."""
        return self.error is not None

    def key(self) -> tuple[str, int, str, str]:
        """(strategy, k, setting, question id)."""
        return (self.strategy, self.top_k, self.setting, self.question_id)

    def to_json(self) -> str:
        """The JSONL line (no trailing newline); `error` only in a failed record's line."""
        data = {key: value for key, value in asdict(self).items() if key != "error" or value is not None}
        return json.dumps(data, default=str, ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> QuestionRecord:
        """Read a JSONL line back. :raises ValueError: For a line that is not a record (torn, or another format)."""
        try:
            data = json.loads(line)
            data["score"] = QuestionScore(**data["score"])
            return cls(**data)
        except (json.JSONDecodeError, TypeError, KeyError) as error:
            raise ValueError(f"not an evaluation record: {line[:80]!r}") from error


def split_evidence(evidence: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a run's evidence into (structured, text): `text` holds `TEXT_EVIDENCE_KEYS` and the notes' texts."""
    structured = {key: value for key, value in evidence.items() if key not in TEXT_EVIDENCE_KEYS}
    text = {key: evidence[key] for key in TEXT_EVIDENCE_KEYS if evidence.get(key) is not None}
    notes = evidence.get("notes")
    if notes is not None:
        structured["notes"] = [{k: v for k, v in note.items() if k != NOTE_TEXT_KEY} for note in notes]
        text["notes"] = [note.get(NOTE_TEXT_KEY) for note in notes]
    return structured, text


def merge_evidence(structured: Mapping[str, Any], text: Mapping[str, Any] | None) -> dict[str, Any]:
    """The inverse of `split_evidence` (notes get their `note` text back when it was kept)."""
    text = text or {}
    merged = {**structured, **{key: text[key] for key in TEXT_EVIDENCE_KEYS if key in text}}
    if "notes" in text and merged.get("notes") is not None:
        merged["notes"] = [{**note, NOTE_TEXT_KEY: note_text}
                           for note, note_text in zip(merged["notes"], text["notes"], strict=False)]  # fmt: skip
    return merged


def _without_runtime(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_runtime(v) for k, v in value.items() if k not in RUNTIME_SETTINGS}
    if isinstance(value, list | tuple):
        return [_without_runtime(v) for v in value]
    return value


def _component_dict(name: str, instance: Any) -> dict[str, Any]:
    try:
        return component_to_dict(instance, name)
    except SerializationError:
        return {"type": f"{type(instance).__module__}.{type(instance).__qualname__}"}


def run_fingerprint(pipeline: Pipeline) -> str:
    """The fingerprint of a run's records, so a resumed run never mixes in records made with other settings: the first
    16 hex digits of the SHA-256 of the pipeline's `to_dict()` without `RUNTIME_SETTINGS` (a component that cannot be
    serialized counts by its class) and of every prompt template (`PROMPTS`)."""
    try:
        serialized = pipeline.to_dict()
    except SerializationError:  # e.g. a lambda callback: each component that cannot be serialized counts by its class
        serialized = {"components": {name: _component_dict(name, instance) for name, instance in pipeline.walk()}}
    prompts = {name: [p.text, p.answer_pattern, list(p.stop)] for name, p in PROMPTS.items()}
    data = {"pipeline": _without_runtime(serialized), "prompts": prompts}
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def repair(path: Path) -> None:
    """Cut a torn last line (a write killed mid-way) off a JSONL file, so the next append starts on a new line."""
    data = path.read_bytes() if path.is_file() else b""
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as file:
            file.truncate(data.rfind(b"\n") + 1)
            file.flush()
            os.fsync(file.fileno())


def append_line(path: Path, line: str) -> None:
    """Append one line with a single write on an O_APPEND descriptor, then fsync: the line is whole or absent."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


def _json_lines(path: Path, parse: Callable[[str], Any]) -> Iterator[Any]:
    """`parse` of each line of a file (none without the file), skipping a torn line (a run killed mid-write)."""
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            yield parse(line)


def read_records(path: Path) -> list[QuestionRecord]:
    """The clean records of a `results.jsonl` file in file order, first of each key; none when there is no file."""
    records: dict[tuple[str, int, str, str], QuestionRecord] = {}
    for record in _json_lines(path, QuestionRecord.from_json):
        if not record.failed:
            records.setdefault(record.key(), record)
    return list(records.values())


def read_failures(path: Path) -> list[QuestionRecord]:
    """The last failed record of each key with no clean record (what a re-run asks again), by first failure."""
    clean: set[tuple[str, int, str, str]] = set()
    failures: dict[tuple[str, int, str, str], QuestionRecord] = {}
    for record in _json_lines(path, QuestionRecord.from_json):
        if record.failed:
            failures[record.key()] = record
        else:
            clean.add(record.key())
    return [record for key, record in failures.items() if key not in clean]


def write_run_manifest(folder: str | Path, *, title: str, dataset: str, command: list[str] | None = None,
                       runtime: Mapping[str, str] | None = None, notes: Sequence[str] = (),
                       strategy_options: Mapping[str, Any] | None = None,
                       prices: Mapping[str, Sequence[float]] | None = None) -> None:  # fmt: skip
    """Write the run folder's `run.json`, read by `haystack-fusion report` (`title`, `dataset` path or URL).
    :param runtime: The runtime that answers (llama.cpp build); every distinct one is listed under `runtimes`.
    :param notes: What the report should say beside the figures, added to those kept, each once.
    :param strategy_options: The `StrategyConfig` fields the run set; None keeps those in `run.json`.
    :param prices: US dollars per million (input, output) tokens per model; None or empty keeps those in `run.json`."""
    previous = read_run_manifest(folder)
    runtimes = list(previous.get("runtimes") or [])
    if runtime is not None and dict(runtime) not in runtimes:
        runtimes.append(dict(runtime))
    kept = list(previous.get("notes") or [])
    kept += [note for note in notes if note not in kept]
    options = previous.get("strategy_options") if strategy_options is None else dict(strategy_options)
    kept_prices = {model: list(price) for model, price in prices.items()} if prices else previous.get("prices")
    manifest: dict[str, Any] = {"title": title, "dataset": dataset, "command": command}
    options = None if options is None else json.loads(json.dumps(options, default=str))
    manifest.update((key, value) for key, value in (("runtimes", runtimes or None), ("notes", kept or None),
                    ("strategy_options", options), ("prices", kept_prices or None)) if value is not None)  # fmt: skip
    (Path(folder) / RUN_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def read_run_manifest(folder: str | Path) -> dict[str, Any]:
    """A run folder's `run.json` (empty for a folder without one)."""
    path = Path(folder) / RUN_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def read_evidence_text(folder: Path) -> dict[tuple[str, int, str, str], dict[str, Any]]:
    """The free-text evidence kept beside a run's records (`evidence_text.jsonl`), by record key; torn lines skipped."""

    def parse(line: str) -> tuple[tuple[str, int, str, str], dict[str, Any]]:
        data = json.loads(line)
        strategy, top_k, setting, question_id = data.pop("key")
        return (strategy, int(top_k), setting, question_id), data

    return dict(reversed(list(_json_lines(folder / EVIDENCE_TEXT_FILE, parse))))  # the first line of each key
