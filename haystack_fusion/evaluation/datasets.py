"""
Evaluation datasets: a passage corpus plus questions with gold answers and, where known, a gold passage.

Liu et al. (section 4) evaluates on the dev splits of NQ, TriviaQA and SQuAD, over 100-word Wikipedia passages, with
and without the gold passage among the top-k. This module loads the two file formats those experiments need:
SQuAD JSON (each paragraph is a passage and the gold passage of its questions) and NQ-open JSONL questions over a
separate passage corpus (JSONL, or a DPR-style `id\\ttext\\ttitle` TSV such as `psgs_w100.tsv`).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from haystack import Document, logging

from haystack_fusion import corpus as _corpus
from haystack_fusion.corpus import Question

logger = logging.getLogger(__name__)

DPR_TSV_HEADER = ("id", "text", "title")
"""The header row a DPR-style passage TSV must start with (as in DPR's `psgs_w100.tsv`)."""


@dataclass(frozen=True)
class EvalDataset:
    """
    A passage corpus and the questions asked over it.

    ### Usage example
    ```python
    from haystack_fusion.corpus import default_squad_path
    from haystack_fusion.evaluation.datasets import load_dataset

    # $HAYSTACK_FUSION_SQUAD, else the official SQuAD 2.0 dev set (downloaded once, checksum-verified)
    dataset = load_dataset(default_squad_path()).limit(10)
    print(dataset.name, len(dataset.documents), dataset.answerable, dataset.unanswerable)
    ```

    :param name: A short name for reports (the file stem of the question file).
    :param documents: The passage corpus to index and retrieve from.
    :param questions: The questions, in file order.
    """

    name: str
    documents: list[Document]
    questions: list[Question]

    @property
    def answerable(self) -> int:
        """The number of questions with a gold answer."""
        return sum(not q.is_impossible for q in self.questions)

    @property
    def unanswerable(self) -> int:
        """The number of questions without a gold answer (`is_impossible`)."""
        return sum(q.is_impossible for q in self.questions)

    def only(self, kind: str) -> EvalDataset:
        """
        Keep the answerable or the unanswerable questions (Yu et al.: noise robustness is measured on answerable
        questions, the reject rate on unanswerable ones).

        :param kind: "all", "answerable" or "unanswerable".
        :returns: A new `EvalDataset` with the same name and documents and those questions, in order.
        :raises ValueError: For another `kind`.
        """
        if kind not in ("all", "answerable", "unanswerable"):
            raise ValueError(f"`kind` must be all, answerable or unanswerable, got {kind!r}")
        if kind == "all":
            return dataclasses.replace(self, questions=list(self.questions))
        keep_impossible = kind == "unanswerable"
        return dataclasses.replace(self, questions=[q for q in self.questions if q.is_impossible == keep_impossible])

    def limit(self, n: int | None) -> EvalDataset:
        """
        The first `n` questions (None: all), over the whole corpus, so retrieval difficulty does not change with `n`.

        :raises ValueError: If `n` is negative.
        """
        if n is None:
            return dataclasses.replace(self, questions=list(self.questions))
        if n < 0:
            raise ValueError(f"`n` must be None or at least 0, got {n}")
        return dataclasses.replace(self, questions=self.questions[:n])

    def sample(self, n: int | None, *, seed: int = 0) -> EvalDataset:
        """
        A fixed stratified random sample of `n` questions (None: all), half answerable and half unanswerable, in file
        order: the same `n` and `seed` give the same questions on every machine. Each stratum is drawn with
        `random.Random(seed).sample`; a short stratum is taken whole and the other fills the rest; an odd `n` gives
        the extra question to the answerable stratum.

        :raises ValueError: If `n` is negative.
        """
        if n is None:
            return dataclasses.replace(self, questions=list(self.questions))
        if n < 0:
            raise ValueError(f"`n` must be None or at least 0, got {n}")
        answerable = [q for q in self.questions if not q.is_impossible]
        unanswerable = [q for q in self.questions if q.is_impossible]
        n_unanswerable = min(n // 2, len(unanswerable))
        n_answerable = min(n - n_unanswerable, len(answerable))
        n_unanswerable = min(n - n_answerable, len(unanswerable))
        rng = random.Random(seed)
        chosen = {q.id for q in rng.sample(answerable, n_answerable)} | {
            q.id for q in rng.sample(unanswerable, n_unanswerable)
        }
        return dataclasses.replace(self, questions=[q for q in self.questions if q.id in chosen])


def load_squad_dataset(path: str | Path) -> EvalDataset:
    """
    Load a SQuAD v1.1 or v2.0 JSON file (`corpus.load_squad`): every distinct paragraph is a passage and the gold
    passage of its questions (Liu et al., section 4); SQuAD 2.0's `is_impossible` questions are unanswerable.

    :raises FileNotFoundError: If `path` does not exist.
    :raises ValueError: If the file is malformed.
    """
    path = Path(path).expanduser()
    documents, questions = _corpus.load_squad(path)
    return EvalDataset(name=path.stem, documents=documents, questions=questions)


def _nq_question(record: Any, where: str, line_no: int) -> Question:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    question = record.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{where}: needs a non-empty string under 'question'")
    answers = record.get("answer")
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        raise ValueError(f"{where}: 'answer' must be a list of strings")
    qid = str(record["id"]) if record.get("id") is not None else f"q{line_no}"
    unique = tuple(dict.fromkeys(answers))
    return Question(id=qid, question=question, answers=unique, is_impossible=not unique, gold_document_id=None)


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
            question = _nq_question(record, where, line_no)
            if question.id in seen:
                raise ValueError(f"{where}: duplicate question id '{question.id}' (first on line {seen[question.id]})")
            seen[question.id] = line_no
            questions.append(question)
    if not questions:
        raise ValueError(f"{path}: no questions found")
    return questions


def load_dpr_tsv_passages(path: str | Path) -> list[Document]:
    """
    Load a DPR-style passage TSV (`id`, `text`, `title` with that header row; DPR's `psgs_w100.tsv`, the 100-word
    passages of Liu et al., section 4), read with `csv` so quoted fields may hold tabs and newlines. Each row is a
    Document with `meta` `{"title", "source_id"}` and Haystack's content-derived id.

    :raises FileNotFoundError: If `path` does not exist.
    :raises ValueError: If the header is missing, a row has not three columns or an empty `text` (the message names
        the line), or there are no passages.
    """
    path = _corpus.local_path(path)
    documents: list[Document] = []
    with path.open(encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter="\t")
        header_seen = False
        for row in reader:
            if not row:
                continue
            where = f"{path}: line {reader.line_num}"
            if not header_seen:
                if tuple(cell.strip().lower() for cell in row) != DPR_TSV_HEADER:
                    raise ValueError(f"{where}: expected the header row 'id<TAB>text<TAB>title', got {row!r}")
                header_seen = True
                continue
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


def _load_corpus(path: Path) -> list[Document]:
    suffix = path.suffix.lower()
    if suffix == ".tsv":
        return load_dpr_tsv_passages(path)
    if suffix == ".jsonl":
        return _corpus.load_jsonl_passages(path)
    raise ValueError(f"Cannot load a passage corpus from '{path}': expected a .jsonl or DPR-style .tsv file")


def load_nq_open(questions_path: str | Path, corpus_path: str | Path) -> EvalDataset:
    """
    Load NQ-open JSONL questions (`question`, `answer`: a list of strings, empty for an unanswerable question, an
    optional `id`, else `q<line>`) over a `.jsonl` or DPR-style `.tsv` corpus. NQ-open has no gold passage, so only
    Liu et al.'s setting without an added gold passage applies.

    :raises FileNotFoundError: If either file does not exist.
    :raises ValueError: If a question line is not a valid object with `question` and `answer`, repeats an id (the
        message names the line), the file is empty, or the corpus has another suffix or is malformed.
    """
    questions_file = _corpus.local_path(questions_path)
    corpus_file = _corpus.local_path(corpus_path)
    questions = _load_nq_questions(questions_file)
    documents = _load_corpus(corpus_file)
    logger.info(
        "Loaded {q} questions from {path} over {n} passages",
        q=len(questions),
        path=str(questions_file),
        n=len(documents),
    )
    return EvalDataset(name=questions_file.stem, documents=documents, questions=questions)


def load_dataset(
    dataset: str | Path, *, corpus: str | Path | None = None, cache_dir: str | Path | None = None
) -> EvalDataset:
    """
    Load an evaluation dataset from a path or an http(s) URL (downloaded once into `cache_dir`): a SQuAD `.json`
    (`load_squad_dataset`) or an NQ-open `.jsonl` with its `corpus` (`load_nq_open`).

    :raises FileNotFoundError: If a local path does not exist.
    :raises ValueError: For another suffix, a `.jsonl` without `corpus`, a `.json` with one, or a malformed file.
    :raises requests.RequestException: If a download fails.
    """
    path = _corpus.local_path(dataset, cache_dir=cache_dir)
    suffix = path.suffix.lower()
    if suffix == ".json":
        if corpus is not None:
            raise ValueError(
                f"'{dataset}' is a SQuAD file, which carries its own passages: `--corpus` is only for .jsonl datasets"
            )
        return load_squad_dataset(path)
    if suffix == ".jsonl":
        if corpus is None:
            raise ValueError(
                f"'{dataset}' is an NQ-open question file: `--corpus` is needed (a .jsonl or DPR-style .tsv passage "
                "file to retrieve from)"
            )
        return load_nq_open(path, _corpus.local_path(corpus, cache_dir=cache_dir))
    raise ValueError(
        f"Cannot load an evaluation dataset from '{dataset}': expected a SQuAD .json or an NQ-open .jsonl file"
    )
