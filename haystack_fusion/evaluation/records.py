"""
Evaluation records: one JSON line per answered question, free of dataset text, fingerprinted, safe to resume.

A run folder holds:

- `results.jsonl`: the records (`QuestionRecord`): question ids, predictions, flags and scores, usage and latency,
  the ids of the passages shown, and the fingerprint of what produced them. No question, gold answer or passage
  text (model text that copies 8 or more words of them, in the prediction or the evidence, is cut out:
  `DatasetText`), so a run can be committed to a repository (`docs/results/<run>/`) and rebuilt by
  `haystack-fusion report` with the dataset file.
- `fingerprints.json`: for each fingerprint, the settings it hashes (strategy, k, passage setting, strategy options,
  prompt hashes, LLM, GGUF hash, retrieval), so a refused resume can say what changed.
- `evidence_text.jsonl`: the model's free text that may quote passages (SuRe's summaries, Chain-of-Note's notes),
  kept for `--export-notes` and for reading, and listed in the folder's `.gitignore`.

Writes are appends of whole lines followed by `fsync`; a run killed mid-write (SIGKILL) leaves at most one torn last
line, which `repair` cuts off before the next append, so resuming neither tears nor duplicates a record.

A question whose answer could not be made cleanly (its pipeline raised, or one of its LLM calls failed after the
client's retries) still gets a line: a failed record, whose `error` says what failed. Reading a file skips failed
records (`read_records`), so a report scores only clean answers and re-running the same command asks exactly the
failed questions again; their new lines follow the old ones, which stay (`read_failures` lists the failures that no
later record replaced). Records of clean answers carry no `error` key: their lines are what they were before failed
records existed.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from haystack_fusion.evaluation.metrics import QuestionScore
from haystack_fusion.prompts import PROMPTS

RESULTS_FILE = "results.jsonl"
CLOSED_BOOK_FILE = "closed_book.jsonl"
FINGERPRINTS_FILE = "fingerprints.json"
EVIDENCE_TEXT_FILE = "evidence_text.jsonl"

TEXT_EVIDENCE_KEYS = ("summaries",)
"""Evidence keys whose values are model text that may quote passages: kept out of the records."""
NOTE_TEXT_KEY = "note"
"""The free-text field of a Chain-of-Note note (its `relevance` label stays in the record)."""

RUNTIME_SETTINGS = (
    "max_concurrency",
    "n_threads",
    "n_threads_batch",
    "verbose",
    "timeout",
    "max_retries",
    "logprobs",
    "top_logprobs",
)
"""Settings that change speed or what a reply reports (token log-probabilities), not predictions: left out of
fingerprints."""


@dataclass
class QuestionRecord:
    """
    One line of `results.jsonl`: a question answered by one strategy at one k in one passage setting.

    :param strategy: The registered strategy name.
    :param top_k: Passages retrieved.
    :param setting: The passage setting's label (`PassageSetting.label()`).
    :param question_id: The dataset's question id.
    :param answerable: Whether the question has a gold answer.
    :param prediction: The strategy's final answer ("unknown" included).
    :param evidence: Structured evidence (votes, candidates, SuRe's scores, note relevance labels, fallback, usage);
        no free text that may quote passages (see `split_evidence`).
    :param passages: Ids of the passages the strategy was shown, in rank order.
    :param score: The question's scores and costs (EM, F1, flags, tokens, calls, seconds).
    :param fingerprint: `RunSettings.fingerprint()` of the settings that produced it.
    :param redacted: Whether `prediction`, or a string of `evidence` (candidates, per-passage answers, a rejected
        answer), had runs of dataset text cut out (`DatasetText.redact`); its `score` was computed on the whole text
        and is kept as it is when the record is rescored.
    :param error: None for a clean answer; for a failed record, what failed, on one line: the component and
        exception when the pipeline raised (`prediction` is then ""), or how many LLM calls failed and the first
        errors when it answered all the same (`prediction`, and `evidence["failures"]`, are then kept for reading).
    """

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
        """The resume key: (strategy, k, setting, question id)."""
        return (self.strategy, self.top_k, self.setting, self.question_id)

    def to_json(self) -> str:
        """The JSONL line (no trailing newline); `error` only in a failed record's line."""
        data = asdict(self)
        if data["error"] is None:
            del data["error"]
        return json.dumps(data, default=str, ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> QuestionRecord:
        """
        Read a JSONL line back.

        :raises ValueError: For a line that is not a record (torn, or another format).
        """
        try:
            data = json.loads(line)
            data["score"] = QuestionScore(**data["score"])
            return cls(**data)
        except (json.JSONDecodeError, TypeError, KeyError) as error:
            raise ValueError(f"not an evaluation record: {line[:80]!r}") from error


REDACT_WORDS = 8
"""A run of this many words or more that a prediction shares with a question or passage (compared as
`DatasetText` compares words) is cut out."""


_ARTICLES = frozenset({"a", "an", "the"})


def _compared_words(words: Sequence[str]) -> tuple[tuple[list[int], list[str]], ...]:
    """
    The words as `DatasetText` compares them, with their positions in `words`, read twice: case-folded letters and
    digits with words of punctuation only left out, and the same without the articles "a", "an", "the" (as SQuAD's
    answer normalization drops them, e.g. in post-fusion's vote keys).
    """
    kept = [
        (i, "".join(character for character in word.casefold() if character.isalnum())) for i, word in enumerate(words)
    ]
    readings = ([(i, w) for i, w in kept if w], [(i, w) for i, w in kept if w and w not in _ARTICLES])
    return tuple(([i for i, _ in reading], [w for _, w in reading]) for reading in readings)


class DatasetText:
    """
    The word runs of a dataset's questions and passages, to keep them out of records.

    A weak model copies the question or a passage into its reply; the record must still hold no dataset text. Every
    maximal run of at least `REDACT_WORDS` whitespace-separated words of the prediction that occurs in a question or
    passage is replaced by `[N words of the dataset]` (N counts the words cut). Words are compared case-folded with
    their punctuation dropped (words of punctuation only are skipped), once with and once without the articles "a",
    "an", "the", so near copies are cut too: "France," for "France", "anglosaxon" for "Anglo-Saxon", and answers
    normalized as SQuAD's evaluation does (post-fusion's vote keys).

    :param texts: The questions and passages.
    """

    def __init__(self, texts: Iterable[str]) -> None:
        self._runs = {
            tuple(words[i : i + REDACT_WORDS])
            for text in texts
            for _, words in _compared_words(text.split())
            for i in range(len(words) - REDACT_WORDS + 1)
        }

    @classmethod
    def of(cls, dataset: Any) -> DatasetText:
        """
        The word runs of a dataset's questions and passages.

        :param dataset: An `EvalDataset` (anything with `questions`, each with a `question`, and `documents`).
        :returns: A `DatasetText` of every question's text and every passage's content.
        """
        return cls([q.question for q in dataset.questions] + [d.content or "" for d in dataset.documents])

    def redact(self, prediction: str) -> tuple[str, bool]:
        """
        Cut the dataset's word runs out of a prediction.

        :param prediction: The prediction.
        :returns: The prediction (whitespace normalized where a run was cut) and whether anything was cut.
        """
        words = prediction.split()
        copied = [False] * len(words)
        for at, compared in _compared_words(words):
            for j in range(len(compared) - REDACT_WORDS + 1):
                if tuple(compared[j : j + REDACT_WORDS]) in self._runs:
                    first, last = at[j], at[j + REDACT_WORDS - 1]
                    copied[first : last + 1] = [True] * (last + 1 - first)
        if not any(copied):
            return prediction, False
        kept: list[str] = []
        i = 0
        while i < len(words):
            if not copied[i]:
                kept.append(words[i])
                i += 1
                continue
            start = i
            while i < len(words) and copied[i]:
                i += 1
            kept.append(f"[{i - start} words of the dataset]")
        return " ".join(kept), True

    def redact_value(self, value: Any) -> tuple[Any, bool]:
        """
        Cut the dataset's word runs out of every string in a JSON-like value: a record's evidence, whose candidates,
        per-passage answers and rejected answers are model text like the prediction.

        :param value: A string, or dicts and lists of them (other values are kept as they are).
        :returns: A copy with every string redacted (`redact`), dict keys included (post-fusion's `votes` are keyed
            by answer): two keys redacted alike get " (2)", " (3)", ... so that no entry is lost; and whether
            anything was cut.
        """
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, Mapping):
            redacted: dict[Any, Any] = {}
            cut_any = False
            for key, item in value.items():
                new_item, cut = self.redact_value(item)
                new_key, key_cut = self.redact(key) if isinstance(key, str) else (key, False)
                unique, n = new_key, 2
                while unique in redacted:
                    unique, n = f"{new_key} ({n})", n + 1
                redacted[unique] = new_item
                cut_any = cut_any or cut or key_cut
            return redacted, cut_any
        if isinstance(value, list | tuple):
            pairs = [self.redact_value(item) for item in value]
            return [item for item, _ in pairs], any(cut for _, cut in pairs)
        return value, False

    def redact_record(self, record: QuestionRecord, *, unmark: Callable[[str], str] | None = None) -> QuestionRecord:
        """
        A record with the dataset's word runs cut out of its prediction (`redact`) and of every string of its
        evidence (`redact_value`: candidates, per-passage answers, a rejected answer), marked `redacted` when
        anything was cut; its score, computed on the whole text, is kept. The runner applies it to every new record,
        `redact_records` to committed ones.

        :param record: A record as made or read.
        :param unmark: Applied to the prediction before matching (e.g. removing datamarks, which break up word runs);
            the prediction is replaced only when something was cut.
        :returns: The record itself when nothing was cut; otherwise a redacted copy.
        """
        prediction, cut = self.redact(unmark(record.prediction) if unmark else record.prediction)
        evidence, evidence_cut = self.redact_value(record.evidence)
        if not (cut or evidence_cut):
            return record
        return replace(record, prediction=prediction if cut else record.prediction, evidence=evidence, redacted=True)


def split_evidence(evidence: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """
    Split a strategy run's evidence into what a record keeps and the free text kept apart.

    :param evidence: `StrategyRun.evidence` (plus usage).
    :returns: (structured, text): `structured` has every key but `TEXT_EVIDENCE_KEYS`, and notes without their
        `note` text; `text` has the summaries and the note texts (None for a run without them).
    """
    structured = {key: value for key, value in evidence.items() if key not in TEXT_EVIDENCE_KEYS}
    text = {key: evidence[key] for key in TEXT_EVIDENCE_KEYS if evidence.get(key) is not None}
    notes = evidence.get("notes")
    if notes is not None:
        structured["notes"] = [{k: v for k, v in note.items() if k != NOTE_TEXT_KEY} for note in notes]
        text["notes"] = [note.get(NOTE_TEXT_KEY) for note in notes]
    return structured, text


def merge_evidence(structured: Mapping[str, Any], text: Mapping[str, Any] | None) -> dict[str, Any]:
    """The inverse of `split_evidence` (notes get their `note` text back when it was kept)."""
    merged = dict(structured)
    for key in TEXT_EVIDENCE_KEYS:
        if text and key in text:
            merged[key] = text[key]
    if text and "notes" in text and merged.get("notes") is not None:
        merged["notes"] = [
            {**note, NOTE_TEXT_KEY: note_text} for note, note_text in zip(merged["notes"], text["notes"], strict=False)
        ]
    return merged


@lru_cache(maxsize=8)
def file_sha256(path: str) -> str:
    """The SHA-256 hex digest of a file (e.g. a GGUF model), read in 1 MiB blocks; cached per path."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _without_runtime(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_runtime(v) for k, v in value.items() if k not in RUNTIME_SETTINGS}
    if isinstance(value, list | tuple):
        return [_without_runtime(v) for v in value]
    return value


def public_class_path(cls: type) -> str:
    """
    A class's import path, through the shortest `haystack_fusion` package that exports it, e.g.
    "haystack_fusion.backends.LocalChatGenerator" for the class defined in `haystack_fusion.backends.local`; other
    packages' classes keep their defining module. Moving a class between this package's internal modules then
    changes no fingerprint.
    """
    parts = cls.__module__.split(".")
    if parts[0] == "haystack_fusion":
        while len(parts) > 1 and getattr(sys.modules.get(".".join(parts[:-1])), cls.__name__, None) is cls:
            parts = parts[:-1]
    return f"{'.'.join(parts)}.{cls.__qualname__}"


def describe_generator(generator: Any) -> dict[str, Any]:
    """
    What identifies an LLM for a fingerprint: its class, model name and generation settings, and for the embedded
    model the GGUF file's SHA-256. Server URLs are left out (the same model behind another port is the same model).

    :param generator: A Haystack ChatGenerator.
    :returns: A JSON-serializable dict.
    """
    description: dict[str, Any] = {
        "class": public_class_path(type(generator)),
        "model": getattr(generator, "model", None),
        "generation_kwargs": _without_runtime(dict(getattr(generator, "generation_kwargs", None) or {})),
    }
    gguf = getattr(generator, "gguf_path", None)
    if callable(gguf):
        path = gguf()
        description["model"] = description["model"] or Path(path).name
        description["gguf_sha256"] = file_sha256(path)
    return description


def prompt_hashes(names: Iterable[str]) -> dict[str, str]:
    """
    SHA-256 (first 16 hex digits) of each named prompt's template text and the pattern text that identifies its
    parser (`PromptTemplate.fingerprint_pattern`: the answer pattern, or the text a pattern rewritten to extract the
    same answers replaced), by name.
    """
    return {
        name: hashlib.sha256(f"{PROMPTS[name].text}\n{PROMPTS[name].fingerprint_pattern}".encode()).hexdigest()[:16]
        for name in sorted(names)
    }


@dataclass(frozen=True)
class RunSettings:
    """
    Everything that decides a record's prediction, hashed into its fingerprint.

    :param strategy: The strategy name.
    :param top_k: Passages retrieved.
    :param setting: The passage setting's label.
    :param options: The `StrategyConfig` fields that shape prompts and parsing (runtime settings left out).
    :param prompts: `prompt_hashes` of the strategy's prompts.
    :param llm: `describe_generator` of the LLM.
    :param retrieval: The retriever and document store, e.g. "memory bm25".
    """

    strategy: str
    top_k: int
    setting: str
    options: dict[str, Any] = field(default_factory=dict)
    prompts: dict[str, str] = field(default_factory=dict)
    llm: dict[str, Any] = field(default_factory=dict)
    retrieval: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The settings as JSON-ready data, runtime settings removed."""
        return _without_runtime(json.loads(json.dumps(asdict(self), default=str, sort_keys=True)))

    def fingerprint(self) -> str:
        """SHA-256 (first 16 hex digits) of the canonical JSON of `as_dict()`."""
        canonical = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class FingerprintMismatchError(ValueError):
    """Resuming would mix records made with other settings into a run."""


def repair(path: Path) -> None:
    """Cut a torn last line (a write killed mid-way) off a JSONL file, so the next append starts on a new line."""
    if not path.is_file():
        return
    data = path.read_bytes()
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


def redact_records(path: Path, text: DatasetText, *, unmark: Callable[[str], str] | None = None) -> int:
    """
    Cut dataset text out of the records of a results file made before the runner redacted something it now does
    (the evidence's candidates and per-passage answers, before 2026-11-24), as the runner would: each record whose
    prediction or evidence loses a run of words (`DatasetText.redact_record`) is marked `redacted`, and its
    score (computed on the whole text) is kept. Other lines (failed records, a torn last line) are kept as they are;
    the file is rewritten atomically, and only when something was cut.

    :param path: A `results.jsonl`.
    :param text: The dataset's questions and passages.
    :param unmark: As for `DatasetText.redact_record`.
    :returns: The number of records redacted here.
    """
    lines, count = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = QuestionRecord.from_json(line)
        except ValueError:
            lines.append(line)
            continue
        redacted = text.redact_record(record, unmark=unmark)
        if redacted is not record:
            line = redacted.to_json()
            count += 1
        lines.append(line)
    if count:
        temporary = path.with_suffix(".tmp")
        temporary.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        os.replace(temporary, path)
    return count


def _read_lines(path: Path) -> Iterator[QuestionRecord]:
    if not path.is_file():
        return
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            yield QuestionRecord.from_json(line)
        except ValueError:  # a torn last line (a run killed mid-write)
            continue


def read_records(path: Path) -> list[QuestionRecord]:
    """
    The clean records of a results file, first occurrence of each key kept; none when the file does not exist.

    Failed records (`QuestionRecord.failed`) and a torn last line (a run killed mid-write) are skipped.

    :param path: A `results.jsonl` file.
    :returns: The records in file order.
    """
    records: dict[tuple[str, int, str, str], QuestionRecord] = {}
    for record in _read_lines(path):
        if not record.failed:
            records.setdefault(record.key(), record)
    return list(records.values())


def read_failures(path: Path) -> list[QuestionRecord]:
    """
    The failed records of a results file that no clean record of the same key follows or precedes: the questions a
    re-run will ask again. The last failure of each key is kept.

    :param path: A `results.jsonl` file.
    :returns: The failed records, in the order their keys first failed.
    """
    clean: set[tuple[str, int, str, str]] = set()
    failures: dict[tuple[str, int, str, str], QuestionRecord] = {}
    for record in _read_lines(path):
        if record.failed:
            failures[record.key()] = record
        else:
            clean.add(record.key())
    return [record for key, record in failures.items() if key not in clean]


def read_run_records(folders: Iterable[str | Path]) -> list[QuestionRecord]:
    """The records of several run folders (their `results.jsonl`), in folder order."""
    return [record for folder in folders for record in read_records(Path(folder) / RESULTS_FILE)]


def read_fingerprints(folder: Path) -> dict[str, dict[str, Any]]:
    """The folder's `fingerprints.json` (fingerprint -> settings); empty when there is none."""
    path = folder / FINGERPRINTS_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def register_fingerprint(folder: Path, settings: RunSettings) -> str:
    """
    Add a run's settings to the folder's `fingerprints.json` (rewritten atomically) and return its fingerprint.

    :param folder: The run folder.
    :param settings: The run's settings.
    :returns: `settings.fingerprint()`.
    """
    fingerprint = settings.fingerprint()
    known = read_fingerprints(folder)
    if fingerprint not in known:
        known[fingerprint] = settings.as_dict()
        temporary = folder / f"{FINGERPRINTS_FILE}.tmp"
        temporary.write_text(json.dumps(known, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(temporary, folder / FINGERPRINTS_FILE)
    return fingerprint


def _changes(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    changes = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            changes += _changes(a, b, f"{prefix}{key}.")
        elif a != b:
            changes.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return changes


def check_fingerprints(folder: Path, records: Iterable[QuestionRecord], settings: RunSettings) -> None:
    """
    Refuse to resume a run whose earlier records of the same strategy, k and setting came from other settings.

    :param folder: The run folder.
    :param records: Its records so far.
    :param settings: The settings of the run about to resume.
    :raises FingerprintMismatchError: When such a record has another fingerprint; the message names the changed
        settings (from `fingerprints.json`) and what to do.
    """
    fingerprint = settings.fingerprint()
    key = (settings.strategy, settings.top_k, settings.setting)
    others = {
        r.fingerprint for r in records if (r.strategy, r.top_k, r.setting) == key and r.fingerprint != fingerprint
    }
    if not others:
        return
    old = sorted(others)[0]
    known = read_fingerprints(folder)
    changed = _changes(known[old], settings.as_dict()) if old in known else ["(no record of the old settings)"]
    flags = [
        f"--{name.replace('_', '-')} off"
        for name in ("answer_checks", "stop_sequences")
        if any(change.startswith(f"options.{name}: None") for change in changed)
    ]
    hint = f" Records made before those options existed resume with `{' '.join(flags)}`." if flags else ""
    raise FingerprintMismatchError(
        f"{folder / RESULTS_FILE} already holds {settings.strategy} top-{settings.top_k} records made with other "
        f"settings (fingerprint {old or 'none'}, now {fingerprint}); changed: {'; '.join(changed[:6])}. "
        f"Resuming would mix them: use another --out folder, or delete those records to start them again.{hint}"
    )


RUN_FILE = "run.json"
"""A run folder's manifest: the report title (backend, model, sample), the dataset it answered, the command."""


def write_run_manifest(
    folder: str | Path,
    *,
    title: str,
    dataset: str,
    command: list[str] | None = None,
    runtime: Mapping[str, str] | None = None,
    notes: Sequence[str] = (),
) -> None:
    """
    Write the run folder's `run.json`, which `haystack-fusion report` reads for the title and the dataset.

    :param folder: The run folder.
    :param title: The report title (names the backend and model).
    :param dataset: The dataset path or URL the run answered.
    :param command: The `haystack-fusion` arguments of the run, if any.
    :param runtime: The runtime that answers this time, e.g. the embedded model's llama.cpp build
        (`backends.local.llama_cpp_runtime`). `run.json` keeps a list, `runtimes`, of every distinct runtime that
        wrote to the folder, in order: a run resumed on another build holds records of each (greedy replies are
        exact within one llama.cpp build only), and the list says so.
    :param notes: What the report should say beside the figures (`Evaluator.notes`); added to those already in
        `run.json` under `notes`, each once.
    """
    previous = read_run_manifest(folder)
    runtimes = list(previous.get("runtimes") or [])
    if runtime is not None and dict(runtime) not in runtimes:
        runtimes.append(dict(runtime))
    kept = list(previous.get("notes") or [])
    kept += [note for note in notes if note not in kept]
    manifest: dict[str, Any] = {"title": title, "dataset": dataset, "command": command}
    if runtimes:
        manifest["runtimes"] = runtimes
    if kept:
        manifest["notes"] = kept
    (Path(folder) / RUN_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def read_run_manifest(folder: str | Path) -> dict[str, Any]:
    """A run folder's `run.json` (empty for a folder without one)."""
    path = Path(folder) / RUN_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def read_evidence_text(folder: Path) -> dict[tuple[str, int, str, str], dict[str, Any]]:
    """The free-text evidence kept beside a run's records (`evidence_text.jsonl`), by record key; torn lines skipped."""
    path = folder / EVIDENCE_TEXT_FILE
    texts: dict[tuple[str, int, str, str], dict[str, Any]] = {}
    if not path.is_file():
        return texts
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            data = json.loads(line)
            strategy, top_k, setting, question_id = data.pop("key")
        except (json.JSONDecodeError, ValueError, KeyError, TypeError):
            continue
        texts.setdefault((strategy, int(top_k), setting, question_id), data)
    return texts
