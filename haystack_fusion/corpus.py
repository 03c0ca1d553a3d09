"""Turn user data (SQuAD JSON, JSONL, text folders, URLs) into Haystack `Document` passages."""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from dataclasses import dataclass
from logging import WARNING
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pooch
from haystack import Document, logging
from haystack.components.preprocessors import DocumentSplitter

from haystack_fusion.settings import CACHE_DIR, SQUAD_VARIABLE, squad_file

logger = logging.getLogger(__name__)

SQUAD_DEV_URL = "https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v2.0.json"  # CC BY-SA 4.0
SQUAD_DEV_SHA256 = "80a5225e94905956a6446d296ca1093975c4d3b3260f1d6c8f68bc2ab77182d8"
SQUAD_DEV_FILE = "squad-dev-v2.0.json"  # its name in the cache folder
_TEXT_SUFFIXES = (".txt", ".md")
_ACCEPTED = "a directory of .txt/.md files, a .jsonl passage file, a SQuAD .json file, or an http(s) URL to one"


@dataclass(frozen=True)
class Question:
    """A question with its gold answers (deduplicated; none when `is_impossible`) and its gold passage's `Document.id`
    (Liu et al. section 4; None for NQ-open). `id`: SQuAD's, NQ-open's or `q<line number>`."""

    id: str
    question: str
    answers: tuple[str, ...]
    is_impossible: bool
    gold_document_id: str | None = None


def _existing(path: str | Path) -> Path:
    if not (path := Path(path).expanduser()).exists():
        raise FileNotFoundError(f"No such file or directory: '{path}'")
    return path


def local_path(path_or_url: str | Path, *, cache_dir: str | Path | None = None) -> Path:
    """A local path, or an http(s) URL's cached download; FileNotFoundError for a missing path."""
    if isinstance(path_or_url, str) and urlparse(path_or_url).scheme.lower() in ("http", "https"):
        return download(path_or_url, cache_dir)
    return _existing(path_or_url)


def _field(obj: Any, key: str, where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise ValueError(f"{where}: missing key '{key}'")
    return obj[key]


def load_squad(path: str | Path) -> tuple[list[Document], list[Question]]:
    """
    A SQuAD v1.1 or v2.0 JSON file as `(documents, questions)`: one Document per distinct context (`meta`: `title`,
    `paragraph`, its index in the article) and one `Question` per question.

    :raises FileNotFoundError: If `path` does not exist.
    :raises ValueError: If the file is not UTF-8 JSON, misses a key (named with where) or holds no paragraphs.
    """
    path = _existing(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: line {e.lineno}, column {e.colno}: invalid JSON ({e.msg})") from e
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not valid UTF-8 text ({e.reason} at byte {e.start})") from e
    articles = _field(data, "data", str(path))
    if not isinstance(articles, list):
        raise ValueError(f"{path}: 'data' must be a list of articles")

    documents: dict[str, Document] = {}
    questions: list[Question] = []
    for a_idx, article in enumerate(articles):
        where = f"{path}: article {a_idx}"
        title = str(article.get("title", "")) if isinstance(article, dict) else ""
        for p_idx, paragraph in enumerate(_field(article, "paragraphs", where)):
            p_where = f"{where}, paragraph {p_idx}"
            context = _field(paragraph, "context", p_where)
            if not isinstance(context, str) or not context.strip():
                raise ValueError(f"{p_where}: 'context' must be a non-empty string")
            if context not in documents:
                documents[context] = Document(content=context, meta={"title": title, "paragraph": p_idx})
            for q_idx, qa in enumerate(paragraph.get("qas") or []):
                q_where = f"{p_where}, question {q_idx}"
                answers = (
                    _field(ans, "text", f"{q_where}, answer {i}") for i, ans in enumerate(qa.get("answers") or [])
                )
                question = Question(
                    id=str(_field(qa, "id", q_where)),
                    question=str(_field(qa, "question", q_where)),
                    answers=tuple(dict.fromkeys(str(answer) for answer in answers)),
                    is_impossible=bool(qa.get("is_impossible", False)),
                    gold_document_id=documents[context].id,
                )
                questions.append(question)
    if not documents:
        raise ValueError(f"{path}: no paragraphs found")
    logger.info("Loaded {n} passages and {q} questions from {path}", n=len(documents), q=len(questions), path=str(path))
    return list(documents.values()), questions


def load_jsonl_passages(path: str | Path) -> list[Document]:
    """
    Passages from a JSON Lines file, one per non-blank line: `text` (else `content`), `id` as `meta["source_id"]`, every
    other key in `meta`.

    :raises FileNotFoundError: If `path` does not exist.
    :raises ValueError: For a line that is no UTF-8 JSON object with a text (naming it), or no passages.
    """
    path = _existing(path)
    documents: list[Document] = []
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}: line {line_no}: not valid UTF-8 text ({e.reason})") from e
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {line_no}: invalid JSON ({e.msg})") from e
            if not isinstance(record, dict):
                raise ValueError(f"{path}: line {line_no}: expected a JSON object, got {type(record).__name__}")
            text = record.pop("text") if "text" in record else record.pop("content", None)
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"{path}: line {line_no}: needs a non-empty string under 'text' or 'content'")
            if "id" in record:
                record["source_id"] = str(record.pop("id"))
            documents.append(Document(content=text, meta=record))
    if not documents:
        raise ValueError(f"{path}: no passages found")
    logger.info("Loaded {n_docs} passages from {path}", n_docs=len(documents), path=str(path))
    return documents


@dataclass(frozen=True)
class SkippedFile:
    """A file of a text folder that gave no passages (`file`: relative, `/` separators), and why: `reason` "not UTF-8",
    "empty" or "unreadable", `detail` e.g. "invalid start byte at byte 1234"."""

    file: str
    reason: str
    detail: str = ""


PIECE_PASSAGES = 1000  # passages per piece of a file `load_text_folder` splits, so a file costs one piece's memory
_READ_BYTES = 1 << 20


def _without_html_comments(parts: list[str], in_comment: bool) -> tuple[list[str], bool]:
    """Words outside Markdown's HTML comments (`<!-- ... -->`), and whether the last word ends inside one."""
    kept: list[str] = []
    for word in parts:
        while word:
            if in_comment:
                end = word.find("-->")
                word, in_comment = ("", True) if end < 0 else (word[end + 3 :], False)
            else:
                start = word.find("<!--")
                if start < 0:
                    kept.append(word)
                    break
                if start:
                    kept.append(word[:start])
                word, in_comment = word[start + 4 :], True
    return kept, in_comment


def _file_pieces(file: Path, piece_words: int) -> Iterator[str]:
    """A UTF-8 file's words in pieces of `piece_words`, read 1 MiB at a time, a `.md` file's HTML comments left out;
    UnicodeDecodeError's `start` is the file offset."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    markdown = file.suffix.lower() == ".md"
    in_comment = False
    words: list[str] = []
    carry = ""
    offset = 0
    with file.open("rb") as f:
        while True:
            data = f.read(_READ_BYTES)
            buffered = len(decoder.getstate()[0])
            try:
                text = carry + decoder.decode(data, final=not data)
            except UnicodeDecodeError as e:
                raise UnicodeDecodeError(e.encoding, e.object, offset - buffered + e.start, offset - buffered + e.end,
                                         e.reason) from None  # fmt: skip
            offset += len(data)
            parts = text.split()
            carry = parts.pop() if data and parts and not text[-1].isspace() else ""
            if markdown:
                parts, in_comment = _without_html_comments(parts, in_comment)
            words.extend(parts)
            while len(words) >= piece_words:
                yield " ".join(words[:piece_words])
                del words[:piece_words]
            if not data:
                break
    if words:
        yield " ".join(words)


def load_text_folder(
    path: str | Path, words_per_passage: int = 100, *, skipped: list[SkippedFile] | None = None
) -> list[Document]:
    """
    Every `.txt` and `.md` file below a folder (sorted) split into passages of at most `words_per_passage` words by
    Haystack's `DocumentSplitter`, `.md` HTML comments left out; `meta["file"]` is the relative path. A file that is
    not UTF-8, empty or unreadable is logged with a warning and appended to `skipped`.

    :raises FileNotFoundError: If `path` does not exist.
    :raises ValueError: If `path` is not a directory, `words_per_passage` is below 1, or no passages are found.
    """
    folder = _existing(path)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a directory")
    if words_per_passage < 1:
        raise ValueError(f"`words_per_passage` must be at least 1, got {words_per_passage}")
    files = sorted(
        (p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in _TEXT_SUFFIXES),
        key=lambda p: p.relative_to(folder).as_posix(),
    )
    splitter = DocumentSplitter(split_by="word", split_length=words_per_passage, split_overlap=0)
    splitter.warm_up()
    documents: list[Document] = []
    skips: list[SkippedFile] = []
    for file in files:
        name = file.relative_to(folder).as_posix()
        passages: list[Document] = []
        try:
            for piece in _file_pieces(file, words_per_passage * PIECE_PASSAGES):
                passages.extend(splitter.run(documents=[Document(content=piece, meta={"file": name})])["documents"])
            skip = None if passages else SkippedFile(name, "empty", "no text")
        except UnicodeDecodeError as e:
            skip = SkippedFile(name, "not UTF-8", f"{e.reason} at byte {e.start}")
        except OSError as e:
            skip = SkippedFile(name, "unreadable", e.strerror or type(e).__name__)
        if skip is None:
            documents.extend(passages)
        else:
            skips.append(skip)
            logger.warning(
                "Skipped {file}: {reason} ({detail})", file=str(file), reason=skip.reason, detail=skip.detail
            )
    if skipped is not None:
        skipped.extend(skips)
    if not documents:
        raise ValueError(
            f"{folder}: no passages found in .txt or .md files" + (f" ({len(skips)} skipped)" if skips else "")
        )
    logger.info("Split {f} files from {path} into {n} passages", f=len(files), path=str(folder), n=len(documents))
    return documents


def load_passages(
    path_or_url: str | Path, *, cache_dir: str | Path | None = None, skipped: list[SkippedFile] | None = None
) -> list[Document]:
    """
    Passages from a folder (`load_text_folder`), a `.jsonl` (`load_jsonl_passages`) or SQuAD `.json` file
    (`load_squad`), or a URL to such a file.

    :raises FileNotFoundError: If a local path does not exist.
    :raises ValueError: If the path is of no accepted kind, or its loader raises `ValueError`.
    :raises requests.HTTPError: If a URL download fails with an HTTP error status.
    """
    path = local_path(path_or_url, cache_dir=cache_dir)
    if path.is_dir():
        return load_text_folder(path, skipped=skipped)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return load_jsonl_passages(path)
    if suffix == ".json":
        return load_squad(path)[0]
    raise ValueError(f"Cannot load passages from '{path_or_url}': expected {_ACCEPTED}")


def _retrieve(url: str, target: Path, sha256: str | None) -> Path:
    """`target`, downloaded with `pooch.retrieve` unless there; pooch's info lines muted."""
    if not target.is_file():
        logger.info("Downloading {url} to {path}", url=url, path=str(target))
    known_hash = None if sha256 is None else f"sha256:{sha256}"
    pooch_logger = pooch.get_logger()
    level = pooch_logger.level
    pooch_logger.setLevel(WARNING)
    try:
        pooch.retrieve(url, known_hash=known_hash, fname=target.name, path=target.parent, progressbar=True)
    finally:
        pooch_logger.setLevel(level)
    return target


def download(url: str, cache_dir: str | Path | None = None) -> Path:
    """
    A URL's file in a cache folder (default `~/.cache/haystack_fusion`), downloaded once (progress bar on stderr, no
    retries), named after the URL path's last segment.

    :raises ValueError: If the URL's path has no file name.
    :raises requests.RequestException: If the request fails (`requests.ConnectionError` when offline,
        `requests.HTTPError` for an HTTP error status).
    """
    name = unquote(urlparse(url).path.rstrip("/").rsplit("/", 1)[-1])
    if not name:
        raise ValueError(f"Cannot derive a file name from URL '{url}'")
    return _retrieve(url, Path(cache_dir if cache_dir is not None else CACHE_DIR).expanduser() / name, None)


def default_squad_path(*, cache_dir: str | Path | None = None) -> Path:
    """
    The SQuAD 2.0 file when none is given: `$HAYSTACK_FUSION_SQUAD`, else the official dev set, downloaded once into
    `cache_dir` (again when the cached copy's SHA-256 differs).

    :raises FileNotFoundError: If `HAYSTACK_FUSION_SQUAD` names a file that does not exist.
    :raises requests.RequestException: If the download fails.
    :raises ValueError: If the downloaded file's SHA-256 is not `SQUAD_DEV_SHA256` (the file is deleted).
    """
    override = squad_file()
    if override:
        path = Path(override).expanduser().resolve()
        if not path.is_file():
            raise FileNotFoundError(f"${SQUAD_VARIABLE} names a missing file: '{path}'")
        return path
    url, sha256 = SQUAD_DEV_URL, SQUAD_DEV_SHA256
    target = Path(cache_dir if cache_dir is not None else CACHE_DIR).expanduser() / SQUAD_DEV_FILE
    if target.is_file() and pooch.file_hash(str(target), alg="sha256") != sha256:
        logger.warning(
            "{path} is not the file of {url} (its SHA-256 differs): downloading it again", path=str(target), url=url
        )
    try:
        return _retrieve(url, target, sha256).resolve()
    except ValueError as error:  # pooch's checksum mismatch: "SHA256 hash of downloaded file (...) does not match ..."
        raise ValueError(f"Refused the download of {url}: {error}") from error
