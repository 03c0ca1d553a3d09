"""
Redaction of run records before they are committed: no question or passage text in `research/results/`.

The package's runner writes what the model said (`haystack_fusion.evaluation.records`). A weak model copies the
question or a passage into its reply, so the records committed here are redacted after a run: every run of
`REDACT_WORDS` or more words a prediction (or a string of its evidence: candidates, per-passage answers, a rejected
answer) shares with the dataset's questions and passages is cut out, and the record is marked `redacted` so that
`haystack-fusion report` keeps the score computed on the whole text.

### Usage example
```python
from pathlib import Path

from haystack_fusion.evaluation.datasets import load_dataset
from haystack_fusion.evaluation.records import RESULTS_FILE
from research.redaction import DatasetText, redact_records

dataset = load_dataset("squad2_dev_subset.json")
print(redact_records(Path("research/results/sample") / RESULTS_FILE, DatasetText.of(dataset)), "records redacted")
```
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from haystack_fusion.evaluation.records import QuestionRecord

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
        anything was cut; its score, computed on the whole text, is kept (`runner.rescore` keeps it too).

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


def redact_records(path: Path, text: DatasetText, *, unmark: Callable[[str], str] | None = None) -> int:
    """
    Cut dataset text out of the records of a results file: each record whose prediction or evidence loses a run of
    words (`DatasetText.redact_record`) is marked `redacted`, and its score (computed on the whole text) is kept.
    Other lines (failed records, a torn last line) are kept as they are; the file is rewritten atomically, and only
    when something was cut.

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
