"""
`haystack-fusion index` on hostile files (issue 15, item 7): non-UTF-8 text, empty files, a file larger than one
piece, many files. Every skipped file is named with its reason; nothing is lost silently. The 50 MB file and the
10,000-file folder are in `research/benchmarks/hostile_index.py`, which measures their wall time and peak RSS.
"""

from __future__ import annotations

import json
import logging

import pytest

import haystack_fusion.corpus as corpus
from haystack_fusion.cli import main
from haystack_fusion.corpus import SkippedFile, load_jsonl_passages, load_passages, load_squad, load_text_folder

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


class TestIndexCommand:
    def test_index_says_what_it_skipped(self, tmp_path, capsys):
        folder = tmp_path / "docs"
        folder.mkdir()
        (folder / "good.txt").write_text("Paris is the capital of France.", encoding="utf-8")
        (folder / "empty.txt").write_bytes(b"")
        (folder / "latin1.txt").write_bytes(LATIN1)

        assert main(["index", str(folder), "--store", str(tmp_path / "index.json")]) == 0

        out = capsys.readouterr().out
        assert "Indexed 1 passages" in out
        assert out.rstrip().endswith("; skipped 2 files: empty.txt (empty), latin1.txt (not UTF-8)")

    def test_index_of_only_bad_files_exits_2_with_one_line(self, tmp_path, capsys):
        (tmp_path / "latin1.txt").write_bytes(LATIN1)

        assert main(["index", str(tmp_path), "--store", str(tmp_path / "index.json")]) == 2

        err = capsys.readouterr().err
        assert (
            err.strip().splitlines()[-1]
            == f"haystack-fusion: {tmp_path}: no passages found in .txt or .md files (1 skipped)"
        )
