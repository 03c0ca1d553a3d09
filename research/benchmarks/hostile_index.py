"""
Benchmark: `haystack-fusion index` on hostile folders (issue 15, item 7): wall time and peak RSS per case.

Each case is a folder generated at run time in a temporary directory (synthetic words, no dataset text):

- `baseline`: one small file (what the command costs with next to nothing to index);
- `non_utf8`: one good file, and one of 2 MB of UTF-8 words ending in Latin-1 accented letters (not UTF-8);
- `empty`: one good file, one empty file and one of only whitespace;
- `one_50mb`: a single 50 MB text file (hard-wrapped lines of random words);
- `files_10k`: 10,000 files of about 1 KB each.

Every case runs the real command in a child process (`haystack-fusion index FOLDER --store ...`, the in-memory store,
BM25) and the peak RSS is that child's own (`os.wait4`'s `ru_maxrss`). Prints per case: exit status, wall time, peak
RSS, passages indexed, the size of the saved index, and the command's lines about skipped files.

Run: `.venv/bin/python -m research.benchmarks.hostile_index [--cases one_50mb,files_10k] [--megabytes 50]
[--files 10000]`.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "nu",
    "pe",
    "ri",
    "sa",
    "to",
    "ve",
    "zu",
    "bra",
    "cle",
    "dro",
    "fin",
    "gal",
    "hem",
    "jor",
    "kel",
    "mon",
    "tra",
]
WORDS = [a + b + c for a in SYLLABLES for b in SYLLABLES for c in SYLLABLES]
"""A synthetic vocabulary of 8,000 made-up words (about 95 distinct words in 100, as many as BM25 has to count in
prose), so no dataset text is read or written."""


def words(rng: random.Random, count: int) -> str:
    """`count` random words, hard-wrapped at about 80 characters."""
    chosen = rng.choices(WORDS, k=count)
    return "\n".join(" ".join(chosen[i : i + 12]) for i in range(0, count, 12)) + "\n"


def make_cases(root: Path, names: list[str], megabytes: int, files: int) -> dict[str, Path]:
    rng = random.Random(0)
    folders: dict[str, Path] = {}
    for name in names:
        folder = root / name
        folder.mkdir()
        (folder / "good.txt").write_text(words(rng, 300), encoding="utf-8")
        if name == "non_utf8":
            latin1 = "Caf\u00e9 cr\u00e8me, na\u00efve fa\u00e7ade.\n".encode("latin-1")
            # 2 MB of good text first: the bad byte comes after the first pieces were split, and the file is still
            # skipped whole
            (folder / "latin1.txt").write_bytes(words(rng, 300_000).encode("utf-8") + latin1)
        elif name == "empty":
            (folder / "empty.txt").write_bytes(b"")
            (folder / "blank.md").write_text(" \n\t\n", encoding="utf-8")
        elif name == "one_50mb":
            target = megabytes * 1024 * 1024
            with (folder / "big.txt").open("w", encoding="utf-8") as f:
                written = 0
                while written < target:
                    chunk = words(rng, 20_000)
                    f.write(chunk)
                    written += len(chunk)
        elif name == "files_10k":
            for i in range(files - 1):
                sub = folder / f"d{i // 1000:02d}"
                sub.mkdir(exist_ok=True)
                (sub / f"f{i:05d}.txt").write_text(words(rng, 150), encoding="utf-8")
        folders[name] = folder
    return folders


def run_case(folder: Path, store: Path) -> dict[str, object]:
    """Index `folder` with the real command in a child process; its wall time, peak RSS and output."""
    command = Path(sys.executable).parent / "haystack-fusion"
    env = {**os.environ, "HAYSTACK_TELEMETRY_ENABLED": "False", "TQDM_DISABLE": "1"}
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen([str(command), "index", str(folder), "--store", str(store)], stdout=out, stderr=err,
                                   env=env)  # fmt: skip
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    indexed = re.search(r"Indexed (\d+) passages", stdout)
    return {
        "status": process.returncode,
        "seconds": seconds,
        "peak_rss_mb": usage.ru_maxrss / 1024,  # Linux: kilobytes
        "passages": int(indexed.group(1)) if indexed else None,
        "index_mb": store.stat().st_size / 2**20 if store.is_file() else None,
        "stdout": stdout.strip(),
        "stderr": [line for line in stderr.splitlines() if line.strip()],
    }


def folder_size(folder: Path) -> tuple[int, float]:
    sizes = [path.stat().st_size for path in folder.rglob("*") if path.is_file()]
    return len(sizes), sum(sizes) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="baseline,non_utf8,empty,one_50mb,files_10k")
    parser.add_argument("--megabytes", type=int, default=50, help="size of one_50mb's file (default 50)")
    parser.add_argument("--files", type=int, default=10_000, help="files of files_10k (default 10,000)")
    args = parser.parse_args()
    names = [name.strip() for name in args.cases.split(",") if name.strip()]
    with tempfile.TemporaryDirectory(prefix="hostile_index_") as tmp:
        root = Path(tmp)
        folders = make_cases(root, names, args.megabytes, args.files)
        print(f"{'case':<10} {'files':>6} {'input MB':>9} {'exit':>4} {'wall s':>7} {'peak RSS MB':>11} "
              f"{'passages':>9} {'index MB':>8}")  # fmt: skip
        details = []
        for name, folder in folders.items():
            files, megabytes = folder_size(folder)
            result = run_case(folder, root / f"{name}.json")
            index_mb = f"{result['index_mb']:.1f}" if result["index_mb"] is not None else "-"
            print(
                f"{name:<10} {files:>6} {megabytes:>9.1f} {result['status']:>4} {result['seconds']:>7.1f} "
                f"{result['peak_rss_mb']:>11.0f} {result['passages'] or '-':>9} {index_mb:>8}",
                flush=True,
            )
            details.append((name, result))
        print()
        for name, result in details:
            print(f"{name}: stdout: {result['stdout']}")
            for line in result["stderr"][-6:]:
                print(f"{name}: stderr: {line.replace(str(root), '$TMP')}")


if __name__ == "__main__":
    main()
