import dataclasses
import json
import os
from pathlib import Path

import pytest
from haystack import Document

from haystack_fusion.corpus import Question, default_squad_path
from haystack_fusion.evaluation.datasets import (
    EvalDataset,
    load_dataset,
    load_dpr_tsv_passages,
)

FIRST_CONTEXT = "The bakery on the corner opened at six and sold rye bread until noon."
SECOND_CONTEXT = "Its oven was fired with beech wood brought in by cart every Monday."


def squad_v2() -> dict:
    return {
        "version": "v2.0",
        "data": [
            {
                "title": "Bakery",
                "paragraphs": [
                    {
                        "context": FIRST_CONTEXT,
                        "qas": [
                            {
                                "id": "s1",
                                "question": "When did the bakery open?",
                                "answers": [
                                    {"text": "at six", "answer_start": 28},
                                    {"text": "six", "answer_start": 31},
                                    {"text": "at six", "answer_start": 28},
                                ],
                                "is_impossible": False,
                            },
                            {
                                "id": "s2",
                                "question": "Who owned the bakery?",
                                "answers": [],
                                "plausible_answers": [{"text": "corner", "answer_start": 18}],
                                "is_impossible": True,
                            },
                        ],
                    },
                    {
                        "context": SECOND_CONTEXT,
                        "qas": [
                            {
                                "id": "s3",
                                "question": "What wood fired the oven?",
                                "answers": [{"text": "beech wood", "answer_start": 23}],
                                "is_impossible": False,
                            }
                        ],
                    },
                ],
            }
        ],
    }


def write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def nq_lines() -> list[str]:
    return [
        json.dumps({"id": "n1", "question": "who baked the rye bread", "answer": ["the bakery", "bakery"]}),
        "",
        json.dumps({"question": "what day did the wood arrive", "answer": ["Monday", "Monday"]}),
        json.dumps({"id": 7, "question": "how many ovens were there", "answer": []}),
    ]


def corpus_jsonl(path: Path) -> Path:
    return write_lines(
        path,
        [
            json.dumps({"id": 1, "title": "Bakery", "text": FIRST_CONTEXT}),
            json.dumps({"id": 2, "title": "Bakery", "text": SECOND_CONTEXT}),
        ],
    )


def corpus_tsv(path: Path) -> Path:
    path.write_text(
        "id\ttext\ttitle\n"
        f"1\t{FIRST_CONTEXT}\tBakery\n"
        '2\t"Wood, in ""quotes"",\twith a tab"\tOven\n'
        "\n"
        f"3\t{SECOND_CONTEXT}\tBakery\n",
        encoding="utf-8",
    )
    return path


class TestEvalDataset:
    @pytest.fixture
    def dataset(self) -> EvalDataset:
        questions = [
            Question(id=f"q{i}", question=f"question {i}", answers=() if i % 2 else ("a",), is_impossible=i % 2 == 1)
            for i in range(5)
        ]
        return EvalDataset(name="toy", documents=[Document(content="passage")], questions=questions)

    def test_counts(self, dataset):
        assert dataset.answerable == 3
        assert dataset.unanswerable == 2

    def test_limit_keeps_first_questions_and_whole_corpus(self, dataset):
        limited = dataset.limit(2)
        assert [q.id for q in limited.questions] == ["q0", "q1"]
        assert limited.documents == dataset.documents
        assert limited.name == "toy"
        assert len(dataset.questions) == 5

    def test_only_answerable_or_unanswerable(self, dataset):
        assert [q.id for q in dataset.only("answerable").questions] == ["q0", "q2", "q4"]
        assert [q.id for q in dataset.only("unanswerable").questions] == ["q1", "q3"]
        assert dataset.only("all").questions == dataset.questions
        assert dataset.only("unanswerable").documents == dataset.documents
        with pytest.raises(ValueError, match="kind"):
            dataset.only("some")

    def test_limit_none_and_beyond_length_keep_all(self, dataset):
        assert dataset.limit(None).questions == dataset.questions
        assert dataset.limit(50).questions == dataset.questions
        assert dataset.limit(0).questions == []

    def test_negative_limit(self, dataset):
        with pytest.raises(ValueError, match="`n`"):
            dataset.limit(-1)

    def test_frozen(self, dataset):
        with pytest.raises(dataclasses.FrozenInstanceError):
            dataset.name = "other"  # type: ignore[misc]
        with pytest.raises(dataclasses.FrozenInstanceError):
            dataset.questions[0].id = "other"  # type: ignore[misc]


class TestLoadSquadDataset:
    def test_v2(self, tmp_path):
        dataset = load_dataset(write_json(tmp_path / "bakery-dev.json", squad_v2()))
        assert dataset.name == "bakery-dev"
        assert [d.content for d in dataset.documents] == [FIRST_CONTEXT, SECOND_CONTEXT]
        first, second = dataset.documents
        assert dataset.questions == [
            Question("s1", "When did the bakery open?", ("at six", "six"), False, first.id),
            Question("s2", "Who owned the bakery?", (), True, first.id),
            Question("s3", "What wood fired the oven?", ("beech wood",), False, second.id),
        ]
        assert (dataset.answerable, dataset.unanswerable) == (2, 1)

    def test_v1_has_no_unanswerable(self, tmp_path):
        data = squad_v2()
        data["version"] = "1.1"
        qas = data["data"][0]["paragraphs"][0]["qas"]
        data["data"][0]["paragraphs"][0]["qas"] = [qas[0]]
        for paragraph in data["data"][0]["paragraphs"]:
            for qa in paragraph["qas"]:
                del qa["is_impossible"]
        dataset = load_dataset(write_json(tmp_path / "v1.json", data))
        assert dataset.unanswerable == 0
        assert dataset.answerable == 2

    def test_malformed_squad_is_a_value_error(self, tmp_path):
        path = tmp_path / "broken.json"
        path.write_text('{"data": [\n  {"title": "x",\n', encoding="utf-8")
        with pytest.raises(ValueError, match=r"broken\.json: line \d+"):
            load_dataset(path)


class TestLoadNqOpen:
    def test_questions_and_jsonl_corpus(self, tmp_path):
        questions = write_lines(tmp_path / "nq-open-dev.jsonl", nq_lines())
        dataset = load_dataset(questions, corpus=corpus_jsonl(tmp_path / "passages.jsonl"))
        assert dataset.name == "nq-open-dev"
        assert dataset.questions == [
            Question("n1", "who baked the rye bread", ("the bakery", "bakery"), False, None),
            Question("q3", "what day did the wood arrive", ("Monday",), False, None),
            Question("7", "how many ovens were there", (), True, None),
        ]
        assert [d.content for d in dataset.documents] == [FIRST_CONTEXT, SECOND_CONTEXT]
        assert dataset.documents[0].meta == {"title": "Bakery", "source_id": "1"}

    def test_dpr_tsv_corpus(self, tmp_path):
        questions = write_lines(tmp_path / "nq.jsonl", nq_lines())
        dataset = load_dataset(questions, corpus=corpus_tsv(tmp_path / "psgs.tsv"))
        assert [d.content for d in dataset.documents] == [
            FIRST_CONTEXT,
            'Wood, in "quotes",\twith a tab',
            SECOND_CONTEXT,
        ]
        assert [d.meta for d in dataset.documents] == [
            {"title": "Bakery", "source_id": "1"},
            {"title": "Oven", "source_id": "2"},
            {"title": "Bakery", "source_id": "3"},
        ]
        assert dataset.documents[0].id == Document(content=FIRST_CONTEXT, meta=dataset.documents[0].meta).id

    @pytest.mark.parametrize(
        ("line", "message"),
        [
            ("{not json", "invalid JSON"),
            ('["a list"]', "expected a JSON object"),
            ('{"answer": ["x"]}', "'question'"),
            ('{"question": "", "answer": ["x"]}', "'question'"),
            ('{"question": "q?", "answer": "x"}', "'answer' must be a list of strings"),
            ('{"question": "q?", "answer": ["x", 3]}', "'answer' must be a list of strings"),
            ('{"question": "q?"}', "'answer' must be a list of strings"),
        ],
    )
    def test_malformed_question_line_names_file_and_line(self, tmp_path, line, message):
        questions = write_lines(tmp_path / "bad.jsonl", [nq_lines()[0], "", line])
        corpus = corpus_jsonl(tmp_path / "passages.jsonl")
        with pytest.raises(ValueError, match=r"bad\.jsonl: line 3: ") as info:
            load_dataset(questions, corpus=corpus)
        assert message in str(info.value)

    def test_duplicate_id_names_both_lines(self, tmp_path):
        line = nq_lines()[0]
        questions = write_lines(tmp_path / "dup.jsonl", [line, line])
        with pytest.raises(ValueError, match=r"dup\.jsonl: line 2: duplicate question id 'n1' \(first on line 1\)"):
            load_dataset(questions, corpus=corpus_jsonl(tmp_path / "passages.jsonl"))

    def test_empty_question_file(self, tmp_path):
        questions = write_lines(tmp_path / "empty.jsonl", [""])
        with pytest.raises(ValueError, match="no questions found"):
            load_dataset(questions, corpus=corpus_jsonl(tmp_path / "passages.jsonl"))

    def test_malformed_jsonl_corpus_names_line(self, tmp_path):
        questions = write_lines(tmp_path / "nq.jsonl", nq_lines())
        corpus = write_lines(tmp_path / "passages.jsonl", [json.dumps({"text": "fine"}), "{oops"])
        with pytest.raises(ValueError, match=r"passages\.jsonl: line 2: invalid JSON"):
            load_dataset(questions, corpus=corpus)

    def test_unsupported_corpus_suffix(self, tmp_path):
        questions = write_lines(tmp_path / "nq.jsonl", nq_lines())
        corpus = write_lines(tmp_path / "passages.csv", ["id,text,title"])
        with pytest.raises(ValueError, match=r"\.jsonl or DPR-style \.tsv"):
            load_dataset(questions, corpus=corpus)

    def test_missing_files(self, tmp_path):
        questions = write_lines(tmp_path / "nq.jsonl", nq_lines())
        with pytest.raises(FileNotFoundError):
            load_dataset(tmp_path / "absent.jsonl", corpus=corpus_jsonl(tmp_path / "passages.jsonl"))
        with pytest.raises(FileNotFoundError):
            load_dataset(questions, corpus=tmp_path / "absent.tsv")


class TestLoadDprTsvPassages:
    def test_wrong_column_count_names_line(self, tmp_path):
        path = tmp_path / "psgs.tsv"
        path.write_text("id\ttext\ttitle\n1\tfine text\tTitle\n\n2\tno title column\n", encoding="utf-8")
        with pytest.raises(ValueError, match=r"psgs\.tsv: line 4: expected 3 tab-separated columns .* got 2"):
            load_dpr_tsv_passages(path)

    def test_line_numbers_count_quoted_newlines(self, tmp_path):
        path = tmp_path / "psgs.tsv"
        path.write_text('id\ttext\ttitle\n1\t"two\nlines"\tTitle\n2\ttoo\tmany\tcolumns\n', encoding="utf-8")
        with pytest.raises(ValueError, match=r"psgs\.tsv: line 4: .* got 4"):
            load_dpr_tsv_passages(path)

    def test_missing_header(self, tmp_path):
        path = tmp_path / "psgs.tsv"
        path.write_text("1\tsome text\tTitle\n", encoding="utf-8")
        with pytest.raises(ValueError, match=r"psgs\.tsv: line 1: expected the header row"):
            load_dpr_tsv_passages(path)

    def test_empty_text(self, tmp_path):
        path = tmp_path / "psgs.tsv"
        path.write_text("id\ttext\ttitle\n1\t \tTitle\n", encoding="utf-8")
        with pytest.raises(ValueError, match=r"psgs\.tsv: line 2: empty 'text'"):
            load_dpr_tsv_passages(path)

    def test_header_only(self, tmp_path):
        path = tmp_path / "psgs.tsv"
        path.write_text("id\ttext\ttitle\n", encoding="utf-8")
        with pytest.raises(ValueError, match="no passages found"):
            load_dpr_tsv_passages(path)


class TestLoadDataset:
    def test_json_is_squad(self, tmp_path):
        dataset = load_dataset(write_json(tmp_path / "mini.json", squad_v2()))
        assert dataset.name == "mini"
        assert len(dataset.questions) == 3
        assert all(q.gold_document_id is not None for q in dataset.questions)

    def test_jsonl_is_nq_open(self, tmp_path):
        questions = write_lines(tmp_path / "nq.JSONL", nq_lines())
        dataset = load_dataset(str(questions), corpus=corpus_tsv(tmp_path / "psgs.tsv"))
        assert dataset.name == "nq"
        assert len(dataset.questions) == 3
        assert len(dataset.documents) == 3
        assert all(q.gold_document_id is None for q in dataset.questions)

    def test_jsonl_without_corpus(self, tmp_path):
        questions = write_lines(tmp_path / "nq.jsonl", nq_lines())
        with pytest.raises(ValueError, match="`--corpus` is needed"):
            load_dataset(questions)

    def test_json_with_corpus(self, tmp_path):
        squad = write_json(tmp_path / "mini.json", squad_v2())
        with pytest.raises(ValueError, match=r"`--corpus` is only for \.jsonl"):
            load_dataset(squad, corpus=corpus_jsonl(tmp_path / "passages.jsonl"))

    def test_unknown_suffix(self, tmp_path):
        path = write_lines(tmp_path / "questions.txt", ["who?"])
        with pytest.raises(ValueError, match=r"SQuAD \.json or an NQ-open \.jsonl"):
            load_dataset(path)

    def test_missing_path(self, tmp_path):
        with pytest.raises(FileNotFoundError):
            load_dataset(tmp_path / "absent.json")

    def test_urls_are_downloaded_first(self, tmp_path, monkeypatch):
        files = {
            "https://example.org/data/nq-open-dev.jsonl": write_lines(tmp_path / "nq-open-dev.jsonl", nq_lines()),
            "https://example.org/data/psgs.tsv": corpus_tsv(tmp_path / "psgs.tsv"),
            "http://example.org/squad.json": write_json(tmp_path / "squad.json", squad_v2()),
        }
        calls = []

        def fake_download(url, cache_dir=None):
            calls.append((url, cache_dir))
            return files[url]

        monkeypatch.setattr("haystack_fusion.corpus.download", fake_download)
        cache = tmp_path / "cache"
        nq = load_dataset(
            "https://example.org/data/nq-open-dev.jsonl", corpus="https://example.org/data/psgs.tsv", cache_dir=cache
        )
        squad = load_dataset("http://example.org/squad.json")
        assert (nq.name, len(nq.questions), len(nq.documents)) == ("nq-open-dev", 3, 3)
        assert (squad.name, len(squad.questions)) == ("squad", 3)
        assert calls == [
            ("https://example.org/data/nq-open-dev.jsonl", cache),
            ("https://example.org/data/psgs.tsv", cache),
            ("http://example.org/squad.json", None),
        ]

    def test_real_squad_subset(self):
        if not os.environ.get("HAYSTACK_FUSION_SQUAD"):  # tests/conftest.py sets it when ../shared has the subset
            pytest.skip("$HAYSTACK_FUSION_SQUAD is unset and ../shared/data/squad2-dev-subset is not there")
        path = default_squad_path()
        dataset = load_dataset(path)
        assert dataset.name == path.stem
        assert len(dataset.questions) == 626
        assert dataset.unanswerable == 333
        assert dataset.answerable == 626 - 333
        assert len(dataset.documents) == 87
        ids = {doc.id for doc in dataset.documents}
        answerable = [q for q in dataset.questions if not q.is_impossible]
        assert all(q.answers for q in answerable)
        assert all(q.gold_document_id in ids for q in answerable)
        assert dataset.limit(10).questions == dataset.questions[:10]
