import hashlib
import json
import logging
import os
from pathlib import Path

import pytest
import requests
from haystack import Document

from haystack_fusion import corpus
from haystack_fusion.corpus import (
    SQUAD_DEV_FILE,
    Question,
    SkippedFile,
    default_squad_path,
    download,
    load_jsonl_passages,
    load_passages,
    load_squad,
    load_text_folder,
)
from tests.file_server import FileServer, closed_port_url

SHARED_CONTEXT = "The lighthouse keeper lit the lamp every evening at dusk."


def squad_v2() -> dict:
    return {
        "version": "v2.0",
        "data": [
            {
                "title": "Lighthouses",
                "paragraphs": [
                    {
                        "context": SHARED_CONTEXT,
                        "qas": [
                            {
                                "id": "q1",
                                "question": "When was the lamp lit?",
                                "answers": [
                                    {"text": "at dusk", "answer_start": 47},
                                    {"text": "every evening", "answer_start": 33},
                                    {"text": "at dusk", "answer_start": 47},
                                ],
                                "is_impossible": False,
                            },
                            {
                                "id": "q2",
                                "question": "What colour was the lamp?",
                                "answers": [],
                                "plausible_answers": [{"text": "lamp", "answer_start": 29}],
                                "is_impossible": True,
                            },
                        ],
                    },
                    {
                        "context": "Foghorns warned ships when the fog was too thick for the light.",
                        "qas": [
                            {
                                "id": "q3",
                                "question": "What did foghorns warn?",
                                "answers": [{"text": "ships", "answer_start": 16}],
                                "is_impossible": False,
                            }
                        ],
                    },
                ],
            },
            {
                "title": "Keepers",
                "paragraphs": [
                    {
                        "context": SHARED_CONTEXT,
                        "qas": [
                            {
                                "id": "q4",
                                "question": "Who lit the lamp?",
                                "answers": [{"text": "The lighthouse keeper", "answer_start": 0}],
                                "is_impossible": False,
                            }
                        ],
                    }
                ],
            },
        ],
    }


def write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


class TestLoadSquad:
    def test_v2_documents_and_questions(self, tmp_path):
        documents, questions = load_squad(write_json(tmp_path / "squad.json", squad_v2()))

        assert [doc.content for doc in documents] == [
            SHARED_CONTEXT,
            "Foghorns warned ships when the fog was too thick for the light.",
        ]
        assert [doc.meta for doc in documents] == [
            {"title": "Lighthouses", "paragraph": 0},
            {"title": "Lighthouses", "paragraph": 1},
        ]
        assert all(isinstance(doc, Document) for doc in documents)
        assert [q.id for q in questions] == ["q1", "q2", "q3", "q4"]
        assert questions[0] == Question(
            id="q1",
            question="When was the lamp lit?",
            answers=("at dusk", "every evening"),
            is_impossible=False,
            gold_document_id=documents[0].id,
        )
        assert questions[1].is_impossible
        assert questions[1].answers == ()
        assert questions[2].gold_document_id == documents[1].id

    def test_duplicate_context_is_indexed_once(self, tmp_path):
        documents, questions = load_squad(write_json(tmp_path / "squad.json", squad_v2()))

        assert len({doc.id for doc in documents}) == len(documents) == 2
        assert questions[3].gold_document_id == questions[0].gold_document_id == documents[0].id

    def test_document_id_is_haystack_default(self, tmp_path):
        documents, _ = load_squad(write_json(tmp_path / "squad.json", squad_v2()))

        expected = Document(content=SHARED_CONTEXT, meta={"title": "Lighthouses", "paragraph": 0})
        assert documents[0].id == expected.id

    def test_v1_without_is_impossible(self, tmp_path):
        data = {
            "version": "1.1",
            "data": [
                {
                    "title": "Bells",
                    "paragraphs": [
                        {
                            "context": "The bell rang twelve times at noon.",
                            "qas": [
                                {
                                    "id": "b1",
                                    "question": "How many times did the bell ring?",
                                    "answers": [{"text": "twelve", "answer_start": 14}],
                                }
                            ],
                        }
                    ],
                }
            ],
        }
        documents, questions = load_squad(write_json(tmp_path / "v1.json", data))

        assert len(documents) == 1
        assert questions == [
            Question(
                id="b1",
                question="How many times did the bell ring?",
                answers=("twelve",),
                is_impossible=False,
                gold_document_id=documents[0].id,
            )
        ]

    def test_invalid_json_names_file_and_line(self, tmp_path):
        path = tmp_path / "broken.json"
        path.write_text('{\n  "version": "v2.0",\n  "data": [,]\n}\n', encoding="utf-8")

        with pytest.raises(ValueError, match=r"broken\.json.*line 3"):
            load_squad(path)

    def test_missing_key_names_article_and_paragraph(self, tmp_path):
        data = squad_v2()
        del data["data"][1]["paragraphs"][0]["context"]

        with pytest.raises(ValueError, match=r"squad\.json: article 1, paragraph 0: missing key 'context'"):
            load_squad(write_json(tmp_path / "squad.json", data))

    def test_missing_question_key_names_question(self, tmp_path):
        data = squad_v2()
        del data["data"][0]["paragraphs"][1]["qas"][0]["question"]

        with pytest.raises(ValueError, match=r"article 0, paragraph 1, question 0: missing key 'question'"):
            load_squad(write_json(tmp_path / "squad.json", data))

    def test_no_paragraphs_is_an_error(self, tmp_path):
        with pytest.raises(ValueError, match=r"empty\.json: no paragraphs"):
            load_squad(write_json(tmp_path / "empty.json", {"version": "v2.0", "data": []}))

    def test_missing_file(self, tmp_path):
        with pytest.raises(FileNotFoundError, match=r"nope\.json"):
            load_squad(tmp_path / "nope.json")


class TestLoadJsonlPassages:
    def test_text_title_id_and_extra_keys(self, tmp_path):
        path = write_jsonl(
            tmp_path / "passages.jsonl",
            [
                json.dumps({"id": 7, "title": "Tides", "text": "Tides follow the moon.", "lang": "en"}),
                "",
                json.dumps({"content": "Waves follow the wind."}),
            ],
        )
        documents = load_jsonl_passages(path)

        assert [doc.content for doc in documents] == ["Tides follow the moon.", "Waves follow the wind."]
        assert documents[0].meta == {"title": "Tides", "source_id": "7", "lang": "en"}
        assert documents[1].meta == {}
        assert documents[0].id == Document(content="Tides follow the moon.", meta=documents[0].meta).id

    def test_malformed_line_names_line(self, tmp_path):
        path = write_jsonl(tmp_path / "bad.jsonl", [json.dumps({"text": "fine"}), "{not json"])

        with pytest.raises(ValueError, match=r"bad\.jsonl: line 2"):
            load_jsonl_passages(path)

    def test_missing_text_names_line(self, tmp_path):
        path = write_jsonl(tmp_path / "notext.jsonl", ["", json.dumps({"title": "No body"})])

        with pytest.raises(ValueError, match=r"line 2: needs a non-empty string"):
            load_jsonl_passages(path)

    def test_non_object_line(self, tmp_path):
        path = write_jsonl(tmp_path / "list.jsonl", ["[1, 2]"])

        with pytest.raises(ValueError, match="line 1: expected a JSON object"):
            load_jsonl_passages(path)

    def test_empty_file_is_an_error(self, tmp_path):
        path = write_jsonl(tmp_path / "empty.jsonl", ["", "   "])

        with pytest.raises(ValueError, match=r"empty\.jsonl: no passages"):
            load_jsonl_passages(path)


class TestLoadTextFolder:
    @pytest.fixture
    def folder(self, tmp_path):
        root = tmp_path / "notes"
        (root / "sub").mkdir(parents=True)
        (root / "long.txt").write_text(" ".join(f"word{i}" for i in range(250)), encoding="utf-8")
        (root / "sub" / "readme.md").write_text("# Title\n\nA short markdown note.", encoding="utf-8")
        (root / "table.csv").write_text("a,b\n1,2\n", encoding="utf-8")
        return root

    def test_passages_and_meta(self, folder):
        documents = load_text_folder(folder)

        assert [doc.meta["file"] for doc in documents] == ["long.txt", "long.txt", "long.txt", "sub/readme.md"]
        assert all(len(doc.content.split()) <= 100 for doc in documents)
        assert [len(doc.content.split()) for doc in documents[:3]] == [100, 100, 50]
        assert [doc.meta["split_id"] for doc in documents[:3]] == [0, 1, 2]
        assert documents[0].content.split()[0] == "word0"
        assert documents[2].content.split()[-1] == "word249"
        assert not any("a,b" in doc.content for doc in documents)

    def test_newlines_count_as_word_breaks(self, tmp_path):
        lines = [" ".join(f"w{line}_{i}" for i in range(10)) for line in range(30)]
        (tmp_path / "wrapped.md").write_text("\n".join(lines) + "\n", encoding="utf-8")

        documents = load_text_folder(tmp_path)

        assert [len(doc.content.split()) for doc in documents] == [100, 100, 100]
        assert all("\n" not in doc.content for doc in documents)

    def test_markdown_comments_are_left_out(self, tmp_path):
        text = (
            "Before <!-- one word --> between\n<!-- a comment\nover lines -->after x<!--glued-->y "
            "<!--unclosed until the end"
        )
        (tmp_path / "page.md").write_text(text, encoding="utf-8")
        (tmp_path / "plain.txt").write_text("kept <!-- as written -->", encoding="utf-8")

        documents = load_text_folder(tmp_path)

        assert [doc.content for doc in documents] == ["Before between after x y", "kept <!-- as written -->"]

    @pytest.mark.parametrize("read_bytes", [1, 3, 7])
    def test_a_comment_across_reads_is_left_out(self, tmp_path, monkeypatch, read_bytes):
        monkeypatch.setattr(corpus, "_READ_BYTES", read_bytes)
        (tmp_path / "page.md").write_text("a <!-- hidden words --> b <!--x-->c", encoding="utf-8")

        assert [doc.content for doc in load_text_folder(tmp_path)] == ["a b c"]

    def test_words_per_passage(self, folder):
        documents = load_text_folder(folder, words_per_passage=50)

        assert sum(doc.meta["file"] == "long.txt" for doc in documents) == 5

    def test_invalid_words_per_passage(self, folder):
        with pytest.raises(ValueError, match="words_per_passage"):
            load_text_folder(folder, words_per_passage=0)

    def test_folder_without_text_files(self, tmp_path):
        (tmp_path / "data.csv").write_text("x\n", encoding="utf-8")

        with pytest.raises(ValueError, match="no passages found"):
            load_text_folder(tmp_path)

    def test_missing_folder(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="absent"):
            load_text_folder(tmp_path / "absent")


class TestLoadPassages:
    def test_dispatches_by_kind(self, tmp_path):
        squad = write_json(tmp_path / "squad.json", squad_v2())
        jsonl = write_jsonl(tmp_path / "p.jsonl", [json.dumps({"text": "One passage."})])
        folder = tmp_path / "folder"
        folder.mkdir()
        (folder / "a.txt").write_text("Some text here.", encoding="utf-8")

        assert len(load_passages(squad)) == 2
        assert [doc.content for doc in load_passages(str(jsonl))] == ["One passage."]
        assert [doc.meta["file"] for doc in load_passages(folder)] == ["a.txt"]

    def test_unknown_kind(self, tmp_path):
        path = tmp_path / "table.csv"
        path.write_text("a,b\n", encoding="utf-8")

        with pytest.raises(ValueError, match=r"table\.csv.*\.jsonl"):
            load_passages(path)

    def test_missing_path(self, tmp_path):
        with pytest.raises(FileNotFoundError, match=r"missing\.jsonl"):
            load_passages(tmp_path / "missing.jsonl")

    def test_url_uses_cache(self, tmp_path, monkeypatch):
        def no_network(*args, **kwargs):
            raise AssertionError("network used")

        monkeypatch.setattr("requests.get", no_network)
        write_jsonl(tmp_path / "remote.jsonl", [json.dumps({"text": "Cached passage."})])

        documents = load_passages("https://example.com/data/remote.jsonl", cache_dir=tmp_path)

        assert [doc.content for doc in documents] == ["Cached passage."]


class TestDownload:
    def test_cached_file_is_returned_without_network(self, tmp_path, monkeypatch):
        def no_network(*args, **kwargs):
            raise AssertionError("network used")

        monkeypatch.setattr("requests.get", no_network)
        cached = tmp_path / "corpus.json"
        cached.write_text("{}", encoding="utf-8")

        assert download("https://example.com/files/corpus.json?raw=1", cache_dir=tmp_path) == cached

    def test_downloads_once_then_uses_the_cache(self, tmp_path):
        body = json.dumps({"text": "A passage."}).encode()
        with FileServer({"/files/corpus.jsonl": body}) as server:
            url = server.url("/files/corpus.jsonl")
            first = download(url, cache_dir=tmp_path / "cache")
            second = download(url, cache_dir=tmp_path / "cache")

        assert first == second == tmp_path / "cache" / "corpus.jsonl"
        assert first.read_bytes() == body
        assert server.requests == ["/files/corpus.jsonl"]
        assert [p.name for p in (tmp_path / "cache").iterdir()] == ["corpus.jsonl"]  # no temporary file left

    def test_http_error_leaves_no_file(self, tmp_path):
        with FileServer({}) as server, pytest.raises(requests.HTTPError, match="404"):
            download(server.url("/missing.json"), cache_dir=tmp_path)

        assert list(tmp_path.iterdir()) == []

    def test_url_without_file_name(self, tmp_path):
        with pytest.raises(ValueError, match="file name"):
            download("https://example.com/", cache_dir=tmp_path)


def squad_bytes() -> bytes:
    return json.dumps(squad_v2()).encode()


@pytest.fixture
def squad_server(monkeypatch):
    """The official dev set's URL and SHA-256 pointed at a small SQuAD file served on 127.0.0.1; no override."""
    body = squad_bytes()
    with FileServer({"/dataset/dev-v2.0.json": body}) as server:
        monkeypatch.setattr(corpus, "SQUAD_DEV_URL", server.url("/dataset/dev-v2.0.json"))
        monkeypatch.setattr(corpus, "SQUAD_DEV_SHA256", hashlib.sha256(body).hexdigest())
        monkeypatch.delenv("HAYSTACK_FUSION_SQUAD", raising=False)
        yield server


class TestDefaultSquadPath:
    def test_environment_variable_overrides(self, tmp_path, monkeypatch):
        path = write_json(tmp_path / "custom.json", squad_v2())
        monkeypatch.setenv("HAYSTACK_FUSION_SQUAD", str(path))
        monkeypatch.setattr(corpus, "SQUAD_DEV_URL", closed_port_url())  # a download would fail

        assert default_squad_path(cache_dir=tmp_path / "cache") == path.resolve()
        assert not (tmp_path / "cache").exists()

    def test_missing_override_is_an_error(self, tmp_path, monkeypatch):
        monkeypatch.setenv("HAYSTACK_FUSION_SQUAD", str(tmp_path / "absent.json"))

        with pytest.raises(FileNotFoundError, match=r"\$HAYSTACK_FUSION_SQUAD names a missing file: .*absent\.json"):
            default_squad_path()

    def test_downloads_the_dev_set_once_checksum_verified(self, tmp_path, squad_server):
        cache = tmp_path / "cache"

        first = default_squad_path(cache_dir=cache)
        second = default_squad_path(cache_dir=cache)

        assert first == second == (cache / SQUAD_DEV_FILE).resolve()
        assert first.read_bytes() == squad_bytes()
        assert len(load_squad(first)[1]) == 4
        assert squad_server.requests == ["/dataset/dev-v2.0.json"]  # the second call used the cache

    def test_wrong_checksum_is_refused(self, tmp_path, squad_server, monkeypatch):
        monkeypatch.setattr(corpus, "SQUAD_DEV_SHA256", "0" * 64)

        with pytest.raises(
            ValueError, match=r"Refused the download of http://127\.0\.0\.1:\d+/dataset/dev-v2\.0\.json"
        ):
            default_squad_path(cache_dir=tmp_path)

        assert list(tmp_path.iterdir()) == []  # nothing kept, so nothing is used later

    def test_cached_copy_with_another_checksum_is_downloaded_again(self, tmp_path, squad_server):
        (tmp_path / SQUAD_DEV_FILE).write_bytes(squad_bytes()[:-10])  # truncated

        path = default_squad_path(cache_dir=tmp_path)

        assert path.read_bytes() == squad_bytes()
        assert squad_server.requests == ["/dataset/dev-v2.0.json"]

    def test_offline_is_a_connection_error(self, tmp_path, monkeypatch):
        monkeypatch.delenv("HAYSTACK_FUSION_SQUAD", raising=False)
        monkeypatch.setattr(corpus, "SQUAD_DEV_URL", closed_port_url())

        with pytest.raises(requests.ConnectionError):
            default_squad_path(cache_dir=tmp_path)

        assert list(tmp_path.iterdir()) == []

    def test_real_squad_subset(self):
        if not os.environ.get("HAYSTACK_FUSION_SQUAD"):  # tests/conftest.py sets it when ../shared has the subset
            pytest.skip("$HAYSTACK_FUSION_SQUAD is unset and ../shared/data/squad2-dev-subset is not there")

        documents, questions = load_squad(default_squad_path())

        assert len(documents) == 87
        assert len(questions) == 626
        assert sum(q.is_impossible for q in questions) == 333
        assert {q.gold_document_id for q in questions} <= {doc.id for doc in documents}
        assert all(q.answers for q in questions if not q.is_impossible)


LATIN1 = "Caf\u00e9 na\u00efve fa\u00e7ade".encode("latin-1")


def reference_passages(text: str, words_per_passage: int = 100) -> list[str]:
    """What splitting the whole text at once gives: whitespace-separated words, `words_per_passage` at a time."""
    words = text.split()
    return [" ".join(words[i : i + words_per_passage]) for i in range(0, len(words), words_per_passage)]


class TestSkippedFiles:
    def test_non_utf8_file_is_skipped_and_named_with_its_byte(self, tmp_path, caplog):
        good = " ".join(f"w{i}" for i in range(250))
        (tmp_path / "a_good.txt").write_text(good, encoding="utf-8")
        prefix = ("ok " * 400_000).encode("utf-8")  # 1.2 MB: the bad byte is read after the first 1 MiB
        (tmp_path / "b_latin1.txt").write_bytes(prefix + LATIN1)
        skipped: list[SkippedFile] = []

        with caplog.at_level(logging.WARNING):
            documents = load_text_folder(tmp_path, skipped=skipped)

        assert [doc.content.strip() for doc in documents] == reference_passages(good)
        bad_byte = len(prefix) + 3  # "Caf" then Latin-1 "é"
        assert skipped == [SkippedFile("b_latin1.txt", "not UTF-8", f"invalid continuation byte at byte {bad_byte}")]
        assert str(tmp_path / "b_latin1.txt") in caplog.text
        assert "not UTF-8" in caplog.text

    def test_empty_and_blank_files_are_skipped_and_named(self, tmp_path, caplog):
        (tmp_path / "good.md").write_text("Some words here.", encoding="utf-8")
        (tmp_path / "empty.txt").write_bytes(b"")
        (tmp_path / "blank.txt").write_text(" \n\t\n", encoding="utf-8")
        (tmp_path / "bom_only.txt").write_bytes(b"\xef\xbb\xbf")
        skipped: list[SkippedFile] = []

        with caplog.at_level(logging.WARNING):
            documents = load_passages(tmp_path, skipped=skipped)

        assert [doc.content for doc in documents] == ["Some words here."]
        assert [(skip.file, skip.reason) for skip in skipped] == [
            ("blank.txt", "empty"),
            ("bom_only.txt", "empty"),
            ("empty.txt", "empty"),
        ]
        for name in ("blank.txt", "bom_only.txt", "empty.txt"):
            assert name in caplog.text
        assert "Document ID" not in caplog.text  # Haystack's splitter never sees an empty document

    def test_only_bad_files_is_an_error_that_counts_them(self, tmp_path):
        (tmp_path / "empty.txt").write_bytes(b"")
        (tmp_path / "latin1.txt").write_bytes(LATIN1)

        with pytest.raises(ValueError, match=r"no passages found in \.txt or \.md files \(2 skipped\)"):
            load_text_folder(tmp_path)


class TestPieces:
    def test_large_file_in_pieces_gives_the_whole_file_passages(self, tmp_path, monkeypatch):
        monkeypatch.setattr(corpus, "PIECE_PASSAGES", 3)
        monkeypatch.setattr(corpus, "_READ_BYTES", 7)  # many reads: words and characters cut across reads
        text = "\n".join(" ".join(f"m\u00fcnze{line}_{i}\u2014\U0001f600" for i in range(13)) for line in range(80))
        (tmp_path / "big.txt").write_text("\ufeff" + text + "\n", encoding="utf-8")

        documents = load_text_folder(tmp_path, words_per_passage=10)

        assert [doc.content.strip() for doc in documents] == reference_passages(text, 10)
        assert {doc.meta["file"] for doc in documents} == {"big.txt"}
        assert len({doc.meta["source_id"] for doc in documents}) == -(-len(documents) // 3)  # one per piece

    def test_many_files(self, tmp_path):
        for i in range(500):
            (tmp_path / f"d{i % 7}").mkdir(exist_ok=True)
            (tmp_path / f"d{i % 7}" / f"f{i:04d}.txt").write_text(f"file {i} " * 60, encoding="utf-8")

        documents = load_text_folder(tmp_path)

        assert len(documents) == 500 * 2  # 120 words: 100 + 20
        assert len({doc.meta["file"] for doc in documents}) == 500


class TestOtherFormats:
    def test_jsonl_not_utf8_names_file_and_line(self, tmp_path):
        path = tmp_path / "p.jsonl"
        path.write_bytes(b'{"text": "fine"}\n{"text": "' + LATIN1 + b'"}\n')

        with pytest.raises(ValueError, match=r"p\.jsonl: line 2: not valid UTF-8 text"):
            load_jsonl_passages(path)

    def test_squad_not_utf8_names_file(self, tmp_path):
        path = tmp_path / "squad.json"
        path.write_bytes(json.dumps({"data": []}).encode()[:-1] + LATIN1 + b"}")

        with pytest.raises(ValueError, match=r"squad\.json: not valid UTF-8 text"):
            load_squad(path)
