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
        """
        Count the questions that have at least one gold answer.

        :returns: The number of questions whose `is_impossible` is False.
        """
        return sum(not q.is_impossible for q in self.questions)

    @property
    def unanswerable(self) -> int:
        """
        Count the questions without a gold answer.

        :returns: The number of questions whose `is_impossible` is True.
        """
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
        Keep only the first `n` questions, for quick runs.

        The corpus is kept whole, so retrieval difficulty does not change with `n`.

        :param n: How many questions to keep, from the start of the list; None keeps all of them.
        :returns: A new `EvalDataset` with the same name and documents and at most `n` questions.
        :raises ValueError: If `n` is negative.
        """
        if n is None:
            return dataclasses.replace(self, questions=list(self.questions))
        if n < 0:
            raise ValueError(f"`n` must be None or at least 0, got {n}")
        return dataclasses.replace(self, questions=self.questions[:n])

    def sample(self, n: int | None, *, seed: int = 0) -> EvalDataset:
        """
        A fixed stratified random sample: half answerable, half unanswerable questions, in file order.

        The same `n` and `seed` give the same questions on every machine and for every strategy, so runs made at
        different times (or resumed after a reset) compare question by question. Each stratum is drawn with
        `random.Random(seed).sample` over the question ids in file order; when a stratum has fewer questions than
        its share, all of them are taken and the other stratum fills the rest. An odd `n` gives the extra question to
        the answerable stratum.

        :param n: How many questions to keep; None keeps all of them.
        :param seed: Seed of the draw.
        :returns: A new `EvalDataset` with the same name and documents and `min(n, len(questions))` questions.
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
    Load a SQuAD v1.1 or v2.0 JSON file as an evaluation dataset.

    Parsing is `haystack_fusion.corpus.load_squad`: every distinct paragraph becomes a Document of the corpus, and
    each question's own paragraph is its gold passage (Liu et al., section 4). SQuAD 2.0 `is_impossible` questions
    are unanswerable (no gold answers); they still carry the id of the paragraph they were asked about.

    :param path: Path to the SQuAD JSON file.
    :returns: An `EvalDataset` named after the file stem.
    :raises FileNotFoundError: If `path` does not exist.
    :raises ValueError: If the file is malformed (see `load_squad`).
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
    Load passages from a DPR-style TSV file (`id`, `text`, `title`, tab-separated, with that header row).

    This is the format of DPR's Wikipedia passages (`psgs_w100.tsv`, the 100-word passages of Liu et al.,
    section 4). Rows are read with the `csv` module (`delimiter="\\t"`), so double-quoted fields may hold tabs,
    quotes (doubled) and newlines. Each row becomes a Document with `content` = `text` and
    `meta` = `{"title": <title>, "source_id": <id>}`; the Document id is Haystack's content-derived hash, as in
    `haystack_fusion.corpus.load_jsonl_passages`. Blank lines are skipped.

    :param path: Path to the `.tsv` file (UTF-8).
    :returns: One Document per data row, in file order.
    :raises FileNotFoundError: If `path` does not exist.
    :raises ValueError: If the first row is not the header `id, text, title`, a row does not have exactly three
        columns or has an empty `text` (the message names the file and the 1-based line number), or the file
        holds no passages.
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
    Load NQ-open style questions and the passage corpus to answer them from.

    The question file is JSON Lines, one object per line: `question` (a non-empty string), `answer` (a list of
    gold answer strings) and an optional `id` (else `q<line number>`); other keys are ignored and blank lines are
    skipped. An empty `answer` list makes the question unanswerable. NQ-open has no gold passage, so every
    `gold_document_id` is None: only Liu et al.'s setting without an added gold passage (section 4) applies.
    The corpus is a `.jsonl` file (read by `haystack_fusion.corpus.load_jsonl_passages`) or a DPR-style `.tsv`
    file (read by `load_dpr_tsv_passages`).

    :param questions_path: Path to the NQ-open `.jsonl` question file (UTF-8).
    :param corpus_path: Path to the passage corpus, `.jsonl` or `.tsv`.
    :returns: An `EvalDataset` named after the question file's stem.
    :raises FileNotFoundError: If either file does not exist.
    :raises ValueError: If a question line is not valid JSON, is not an object, lacks `question`, has an `answer`
        that is not a list of strings, or repeats an earlier id (the message names the file and the 1-based line
        number); if the question file is empty; or if the corpus has an unsupported suffix or is malformed.
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
    Load an evaluation dataset from a local file or an http(s) URL, choosing the loader by file suffix.

    URLs (for the dataset and for the corpus) are first downloaded with `haystack_fusion.corpus.download`
    (cached). Then a `.json` file goes to `load_squad_dataset` (its paragraphs are the corpus) and a `.jsonl` file
    to `load_nq_open`, which needs the separate passage corpus given as `corpus`.

    :param dataset: A SQuAD `.json` or NQ-open `.jsonl` question file, as a local path or an http(s) URL.
    :param corpus: The passage corpus (`.jsonl` or DPR-style `.tsv`, path or URL); required for `.jsonl` datasets
        and not accepted for SQuAD, which carries its own.
    :param cache_dir: Where downloaded files are kept; defaults to `~/.cache/haystack_fusion`.
    :returns: The `EvalDataset`, named after the dataset file's stem.
    :raises FileNotFoundError: If a local path does not exist.
    :raises ValueError: If the suffix is neither `.json` nor `.jsonl`, a `.jsonl` dataset comes without `corpus`,
        a `.json` dataset comes with one, or the loader raises `ValueError`.
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
