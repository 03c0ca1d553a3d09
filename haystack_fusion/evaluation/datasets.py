"""Evaluation datasets: a passage corpus plus questions with gold answers and, where known, a gold passage, in the
formats of Liu et al. (section 4): SQuAD JSON, and NQ-open JSONL over a passage corpus."""

from __future__ import annotations

import csv
import dataclasses
import json
import random
from dataclasses import dataclass
from pathlib import Path

from haystack import Document, logging

from haystack_fusion import corpus as _corpus
from haystack_fusion.corpus import Question

logger = logging.getLogger(__name__)

DPR_TSV_HEADER = ("id", "text", "title")


@dataclass(frozen=True)
class EvalDataset:
    """A passage corpus (`documents`) and the `questions` asked over it, in file order; `name`: the file stem."""

    name: str
    documents: list[Document]
    questions: list[Question]

    @property
    def answerable(self) -> int:
        """The number of questions with a gold answer."""
        return sum(not q.is_impossible for q in self.questions)

    @property
    def unanswerable(self) -> int:
        """The number of questions without one."""
        return len(self.questions) - self.answerable

    def _keep(self, questions: list[Question]) -> EvalDataset:
        return dataclasses.replace(self, questions=list(questions))

    def only(self, kind: str) -> EvalDataset:
        """Keep "all", the "answerable" or the "unanswerable" questions, in order. :raises ValueError: Another kind."""
        if kind not in ("all", "answerable", "unanswerable"):
            raise ValueError(f"`kind` must be all, answerable or unanswerable, got {kind!r}")
        return self._keep([q for q in self.questions if kind == "all" or q.is_impossible == (kind == "unanswerable")])

    def limit(self, n: int | None) -> EvalDataset:
        """The first `n` questions (None: all), over the whole corpus. :raises ValueError: If `n` is negative."""
        if n is not None and n < 0:
            raise ValueError(f"`n` must be None or at least 0, got {n}")
        return self._keep(self.questions[:n])

    def sample(self, n: int | None, *, seed: int = 0) -> EvalDataset:
        """A fixed stratified random sample of `n` questions (None: all), half answerable and half unanswerable (a short
        stratum is taken whole), in file order. :raises ValueError: If `n` is negative."""
        if n is None or n < 0:
            return self.limit(n)
        answerable = [q for q in self.questions if not q.is_impossible]
        unanswerable = [q for q in self.questions if q.is_impossible]
        n_answerable = min(n - min(n // 2, len(unanswerable)), len(answerable))
        n_unanswerable = min(n - n_answerable, len(unanswerable))
        rng = random.Random(seed)
        chosen = {q.id for q in [*rng.sample(answerable, n_answerable), *rng.sample(unanswerable, n_unanswerable)]}
        return self._keep([q for q in self.questions if q.id in chosen])


def _load_nq_questions(path: Path) -> list[Question]:
    questions: list[Question] = []
    seen: dict[str, int] = {}
    with path.open(encoding="utf-8-sig") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}: line {line_no}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: invalid JSON ({e.msg})") from e
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
            question, answers = record.get("question"), record.get("answer")
            if not isinstance(question, str) or not question.strip():
                raise ValueError(f"{where}: needs a non-empty string under 'question'")
            if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
                raise ValueError(f"{where}: 'answer' must be a list of strings")
            qid = str(record["id"]) if record.get("id") is not None else f"q{line_no}"
            if qid in seen:
                raise ValueError(f"{where}: duplicate question id '{qid}' (first on line {seen[qid]})")
            seen[qid], unique = line_no, tuple(dict.fromkeys(answers))
            questions.append(Question(qid, question, unique, is_impossible=not unique, gold_document_id=None))
    if not questions:
        raise ValueError(f"{path}: no questions found")
    return questions


def load_dpr_tsv_passages(path: str | Path) -> list[Document]:
    """Load a DPR-style passage TSV (header `id`, `text`, `title`; DPR's `psgs_w100.tsv`, Liu et al., section 4) as
    Documents with `meta` `{"title", "source_id"}`.
    :raises FileNotFoundError: If `path` does not exist. :raises ValueError: For a malformed file or no passages."""
    path = _corpus.local_path(path)
    documents: list[Document] = []
    with path.open(encoding="utf-8-sig", newline="") as f:
        rows = filter(None, reader := csv.reader(f, delimiter="\t"))
        if (header := next(rows, None)) is not None and tuple(c.strip().lower() for c in header) != DPR_TSV_HEADER:
            raise ValueError(f"{path}: line {reader.line_num}: expected the header row 'id<TAB>text<TAB>title', got "
                             f"{header!r}")  # fmt: skip
        for row in rows:
            where = f"{path}: line {reader.line_num}"
            if len(row) != len(DPR_TSV_HEADER):
                raise ValueError(f"{where}: expected 3 tab-separated columns (id, text, title), got {len(row)}")
            source_id, text, title = row
            if not text.strip():
                raise ValueError(f"{where}: empty 'text' column")
            documents.append(Document(content=text, meta={"title": title, "source_id": source_id}))
    if not documents:
        raise ValueError(f"{path}: no passages found")
    logger.info("Loaded {n_docs} passages from {path}", n_docs=len(documents), path=str(path))
    return documents


def load_dataset(dataset: str | Path, *, corpus: str | Path | None = None,
                 cache_dir: str | Path | None = None) -> EvalDataset:  # fmt: skip
    """Load an evaluation dataset from a path or an http(s) URL (downloaded once into `cache_dir`).
    - A SQuAD v1.1 or v2.0 `.json` (`corpus.load_squad`): each paragraph is the gold passage of its questions.
    - An NQ-open `.jsonl` (`question`, `answer` list, optional `id`) over a `corpus` (`.jsonl` or DPR-style `.tsv`).
    :raises FileNotFoundError: If a local path does not exist. :raises requests.RequestException: If a download fails.
    :raises ValueError: For another suffix, a `.jsonl` without `corpus`, a `.json` with one, or a malformed file."""
    path = _corpus.local_path(dataset, cache_dir=cache_dir)
    if (suffix := path.suffix.lower()) == ".json":
        if corpus is not None:
            raise ValueError(f"'{dataset}' is a SQuAD file, which carries its own passages: `--corpus` is only for "
                             ".jsonl datasets")  # fmt: skip
        documents, questions = _corpus.load_squad(path)
        return EvalDataset(name=path.stem, documents=documents, questions=questions)
    if suffix != ".jsonl":
        raise ValueError(f"Cannot load an evaluation dataset from '{dataset}': expected a SQuAD .json or an NQ-open "
                         ".jsonl file")  # fmt: skip
    if corpus is None:
        raise ValueError(f"'{dataset}' is an NQ-open question file: `--corpus` is needed (a .jsonl or DPR-style .tsv "
                         "passage file to retrieve from)")  # fmt: skip
    corpus_file = _corpus.local_path(corpus, cache_dir=cache_dir)
    questions = _load_nq_questions(path)
    loaders = {".tsv": load_dpr_tsv_passages, ".jsonl": _corpus.load_jsonl_passages}
    if (load := loaders.get(corpus_file.suffix.lower())) is None:
        raise ValueError(f"Cannot load a passage corpus from '{corpus_file}': expected a .jsonl or DPR-style .tsv file")
    documents = load(corpus_file)
    logger.info("Loaded {q} questions from {path} over {n} passages", q=len(questions), path=str(path),
                n=len(documents))  # fmt: skip
    return EvalDataset(name=path.stem, documents=documents, questions=questions)
