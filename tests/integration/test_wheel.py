"""
The package as a user gets it: build the sdist and the wheel, check them with twine, install the wheel into a fresh
virtual environment, and run what a user of the wheel runs.

In the fresh environment (no access to this checkout: it runs in a temporary folder with a clean `PYTHONPATH`):

- `haystack-fusion pipelines --out DIR` writes exactly the repository's `pipelines/` folder (the wrappers and the
  embedded default's YAML), and `--document-store elasticsearch --llm openai` adds the Elasticsearch + OpenAI YAML;
- every generated YAML loads with `Pipeline.loads`, so each component it names resolves from the wheel and its
  extras, and every generated Hayhooks wrapper imports;
- one generated YAML runs end to end: `concat_pf__es_bm25_openai.yml` with two edits that are stated, not hidden.
  Its Elasticsearch BM25 retriever becomes Haystack's in-memory BM25 retriever (the same sockets: `query` in,
  `documents` out) holding the SQuAD 2.0 subset, because no Elasticsearch server runs here; and each completion is
  bounded (`max_tokens`, a stop sequence), because the packaged base model does not stop by itself. Its
  OpenAIChatGenerators reach llama-cpp-python's OpenAI-compatible server on 127.0.0.1 (serving the packaged GGUF,
  started from the development environment as a stand-in for OpenAI) through `OPENAI_BASE_URL`;
- `haystack-fusion index` and `ask` answer a question on the embedded model (the `local` extra).

The fresh environment gets the same torch release and the same llama-cpp-python build as the development one: pip
takes torch's CPU build from the machine's wheel folder, and llama-cpp-python is the wheel the Makefile built for
`.venv` (`.cache/llama-cpp-python/`, the portable build), installed by its path. Left to pip, the install would take
a wheel from pip's cache, which does not record the build's instruction set: a native build made for this CPU would
come back (one that crashes on an Intel AMX host), or pip would build one (6 min).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from haystack_fusion.__about__ import __version__
from haystack_fusion.backends import llama_cpp_runtime, packaged_model_path
from haystack_fusion.corpus import default_squad_path, load_squad
from haystack_fusion.settings import SQUAD_VARIABLE

from .conftest import free_port, stop, wait_until_ready

pytest.importorskip("build", reason="`build` (the `dev` extra)")
pytest.importorskip("twine", reason="`twine` (the `dev` extra)")
httpx = pytest.importorskip("httpx")
pytest.importorskip("llama_cpp.server.app", reason="llama-cpp-python[server] (the `dev` extra)")

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = "local,dense,elasticsearch,ollama,serve"
"""Every runtime extra a generated file needs: the YAML name the embedded model, Elasticsearch, OpenAI, Ollama and the
packaged MiniLM embedder; the wrappers need Hayhooks; `ask` the embedded model."""

LLAMA_CPP_WHEELS = ROOT / ".cache" / "llama-cpp-python"
"""Where the Makefile leaves the llama-cpp-python wheel it built and installed into `.venv`."""

STEP_SECONDS = 1500
"""Upper bound of one step (the install, if llama-cpp-python had to be built after all)."""

LOAD_ALL = """
import importlib.util
import sys
from pathlib import Path

import haystack_fusion
from haystack import Pipeline
from haystack_fusion.serving.app import create_app, create_mcp_app
from haystack_fusion.serving.hayhooks import StrategyPipelineWrapper

out = Path(sys.argv[1])
assert Path(haystack_fusion.__file__).is_relative_to(sys.prefix), haystack_fusion.__file__
paths = sorted(out.rglob("*.yml"))
for path in paths:
    Pipeline.loads(path.read_text(encoding="utf-8"))
print(f"loaded {len(paths)} YAML pipelines with haystack_fusion from {haystack_fusion.__file__}")
wrappers = sorted(out.glob("*/pipeline_wrapper.py"))
for path in wrappers:
    spec = importlib.util.spec_from_file_location(f"wrapper_{path.parent.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert issubclass(module.PipelineWrapper, StrategyPipelineWrapper), path
    assert module.PipelineWrapper.strategy == path.parent.name, path
print(f"imported {len(wrappers)} Hayhooks wrappers")
"""

RUN_ONE = """
import json
import sys

import haystack_fusion
import yaml
from haystack import Document, Pipeline

yaml_path, documents_path, question = sys.argv[1:4]
data = yaml.safe_load(open(yaml_path, encoding="utf-8"))
inputs, outputs = data.pop("inputs"), data.pop("outputs")

# Edit 1: no Elasticsearch server here; Haystack's in-memory BM25 retriever has the same sockets.
retriever = data["components"]["retriever"]
assert retriever["type"].endswith("ElasticsearchBM25Retriever"), retriever["type"]
retriever["type"] = "haystack.components.retrievers.in_memory.bm25_retriever.InMemoryBM25Retriever"
retriever["init_parameters"] = {
    "document_store": {
        "type": "haystack.document_stores.in_memory.document_store.InMemoryDocumentStore",
        "init_parameters": {},
    },
    "top_k": retriever["init_parameters"]["top_k"],
}

# Edit 2: bound every completion (the packaged base model does not stop by itself), also where a call limit sends a
# one-prompt chain's stop sequences at run time (they would cut the base model's reply at its leading newline).
generators = []
def bound(node):
    if isinstance(node, dict):
        if str(node.get("type", "")).endswith("OpenAIChatGenerator"):
            node["init_parameters"]["generation_kwargs"].update(max_tokens=48, stop=["\\n\\n"])
            generators.append(node)
        elif str(node.get("type", "")).endswith("CallLimitedChatGenerator"):
            node["init_parameters"]["generation_kwargs"] = {"stop": ["\\n\\n"]}
        for value in node.values():
            bound(value)
    elif isinstance(node, list):
        for value in node:
            bound(value)
bound(data)

pipeline = Pipeline.from_dict(data)
documents = [Document.from_dict(d) for d in json.load(open(documents_path, encoding="utf-8"))]
pipeline.get_component("retriever").document_store.write_documents(documents)
result = pipeline.run({target.split(".")[0]: {"query": question} for target in inputs["query"]})
component, socket = outputs["answers"].split(".")
answers = result[component][socket]
print(json.dumps({
    "haystack_fusion": haystack_fusion.__file__,
    "generators": len(generators),
    "answers": [{"data": a.data, "documents": len(a.documents), "meta": a.meta} for a in answers],
}, default=str))
"""


def run(command: list[str], *, timeout: float = STEP_SECONDS, **kwargs) -> str:
    """Run a command; fail the test with its output's tail when it fails. Returns its standard output."""
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)
    print(f"$ {' '.join(command)[:300]}  ({time.monotonic() - started:.1f} s, exit {result.returncode})")
    if result.returncode != 0:
        pytest.fail(f"{command[:4]} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """`python -m build`: the sdist, then the wheel built from the sdist (so the sdist is proven complete)."""
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)])
    return out


@pytest.fixture(scope="module")
def wheel(dist) -> Path:
    return dist / f"haystack_fusion-{__version__}-py3-none-any.whl"


@pytest.fixture(scope="module")
def sdist(dist) -> Path:
    return dist / f"haystack_fusion-{__version__}.tar.gz"


@pytest.fixture(scope="module")
def fresh(tmp_path_factory, wheel) -> dict:
    """
    A new virtual environment (no system site-packages) with the wheel and its runtime extras, and the environment
    and working folder to run it in: nothing of this checkout on the path.
    """
    home = tmp_path_factory.mktemp("fresh")
    venv = home / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", HAYSTACK_TELEMETRY_ENABLED="False")
    version = importlib.metadata.version("llama_cpp_python")
    llama_wheels = sorted(LLAMA_CPP_WHEELS.glob(f"llama_cpp_python-{version}-*.whl"))
    if not llama_wheels:
        message = f"no llama-cpp-python {version} wheel in {LLAMA_CPP_WHEELS}: `make install-dev` builds it"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    pins = [f"torch=={importlib.metadata.version('torch').split('+')[0]}", str(llama_wheels[-1])]
    log = run(
        [str(venv / "bin" / "pip"), "install", "--no-compile", *pins, f"{wheel}[{EXTRAS}]"],
        env=env,
        cwd=home,
    )
    built = [line for line in log.splitlines() if "Building wheel for" in line]
    print(f"built during the install: {built or 'nothing'}")
    return {"python": str(venv / "bin" / "python"), "bin": venv / "bin", "env": env, "cwd": home}


def test_twine_check(dist):
    out = run([sys.executable, "-m", "twine", "check", "--strict", *map(str, sorted(dist.iterdir()))])
    assert out.count("PASSED") == 2, out


def test_wheel_holds_the_package_typed_and_licensed(wheel):
    info = f"haystack_fusion-{__version__}.dist-info"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(f"{info}/METADATA").decode()
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    modules = {path.relative_to(ROOT).as_posix() for path in (ROOT / "haystack_fusion").rglob("*.py")}
    assert modules <= names, sorted(modules - names)
    assert "haystack_fusion/py.typed" in names
    assert f"{info}/licenses/LICENSE" in names
    assert not [name for name in names if name.startswith(("tests/", "docs/", "pipelines/", "research/"))]
    records = [name for name in names if name.endswith((".jsonl", ".png")) or "/results/" in name]
    assert not records, records[:5]  # the run records and charts of research/results
    assert "haystack_fusion/serving/chainlit_elements/FusionEvidence.jsx" in names  # the chat UI's evidence card
    assert "License-Expression: Apache-2.0" in metadata
    for label in ("Documentation", "Issues", "Source", "Changelog"):
        assert f"Project-URL: {label}, " in metadata, label
    assert "haystack-fusion = haystack_fusion.cli:main" in entry_points


def test_sdist_holds_the_project_without_the_research_bench(sdist):
    top = f"haystack_fusion-{__version__}/"
    with tarfile.open(sdist) as archive:
        names = {name.removeprefix(top) for name in archive.getnames()}
    for required in ("LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml", "Makefile", "haystack_fusion/py.typed",
                     "docs/design.md", "tests/conftest.py", "tests/support/__init__.py",
                     "tests/integration/test_wheel.py"):  # fmt: skip
        assert required in names, required
    assert any(name.startswith("pipelines/") for name in names)
    bulk = [name for name in names if name.startswith(("research/", ".venv", ".cache", ".git/", "dist/"))]
    assert not bulk, bulk[:5]
    assert not [name for name in names if name.endswith(".jsonl")]  # no run records


def shipped_files(folder: Path) -> dict[str, str]:
    return {
        path.relative_to(folder).as_posix(): path.read_text(encoding="utf-8")
        for path in sorted(folder.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


ES_OPENAI = ("--document-store", "elasticsearch", "--llm", "openai")
"""The flags of the Elasticsearch + OpenAI YAML (`es_bm25_openai`), generated beside the default's."""


@pytest.fixture(scope="module")
def generated(fresh) -> Path:
    """`haystack-fusion pipelines --out DIR` run from the wheel: the defaults, then with `ES_OPENAI`."""
    out = fresh["cwd"] / "pipelines"
    for flags in ((), ES_OPENAI):
        command = [str(fresh["bin"] / "haystack-fusion"), "pipelines", "--out", str(out), *flags]
        print(run(command, env=fresh["env"], cwd=fresh["cwd"]))
    return out


def test_the_wheel_generates_the_repository_pipelines(generated):
    files = shipped_files(generated)
    wrappers = [name for name in files if name.endswith("/pipeline_wrapper.py")]
    es_openai = [name for name in files if name.endswith("__es_bm25_openai.yml")]
    assert wrappers
    assert len(es_openai) == len(wrappers)  # one per strategy
    assert {name: text for name, text in files.items() if name not in es_openai} == shipped_files(ROOT / "pipelines")


def test_every_generated_yaml_loads_and_every_wrapper_imports_from_the_wheel(fresh, generated):
    env = {**fresh["env"], "OPENAI_API_KEY": "sk-test-not-a-real-key"}
    out = run([fresh["python"], "-c", LOAD_ALL, str(generated)], env=env, cwd=fresh["cwd"])
    print(out)
    assert f"loaded {len(list(generated.rglob('*.yml')))} YAML pipelines" in out
    assert str(fresh["cwd"]) in out  # haystack_fusion came from the fresh environment
    assert f"imported {len(list(generated.glob('*/pipeline_wrapper.py')))} Hayhooks wrappers" in out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """llama-cpp-python's OpenAI-compatible server on the packaged GGUF, on 127.0.0.1 (the stand-in for OpenAI)."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("llama_server") / "server.log"
    command = [sys.executable, "-m", "llama_cpp.server", "--model", packaged_model_path(), "--host", "127.0.0.1",
               "--port", str(port), "--n_ctx", "8192", "--model_alias", "gpt-4o-mini"]  # fmt: skip
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}/v1"
        try:
            wait_until_ready(
                lambda: httpx.get(f"{url}/models", timeout=2).status_code == 200, process, log_path, what="server"
            )
            yield url, log_path
        finally:
            stop(process)


def test_a_generated_yaml_runs_end_to_end(fresh, generated, squad, server, tmp_path):
    server_url, server_log = server
    documents, questions = squad
    documents_path = tmp_path / "documents.json"
    documents_path.write_text(json.dumps([document.to_dict() for document in documents]), encoding="utf-8")
    question = questions[0].question
    env = {**fresh["env"], "OPENAI_API_KEY": "not-needed-by-a-local-server", "OPENAI_BASE_URL": server_url}
    env["OPENAI_TIMEOUT"] = "300"
    yaml_path = next(generated.rglob("concat_pf__es_bm25_openai.yml"))
    out = run([fresh["python"], "-c", RUN_ONE, str(yaml_path), str(documents_path), question], env=env, cwd=tmp_path)
    result = json.loads(out.strip().splitlines()[-1])
    print(question, "->", json.dumps(result)[:2000])
    assert result["haystack_fusion"].startswith(str(fresh["cwd"]))
    assert result["generators"] == 2  # the concatenation's LLM and the post-fusion voter's
    assert len(result["answers"]) == 1
    answer = result["answers"][0]
    assert answer["data"].strip()
    assert answer["documents"] > 0
    served = server_log.read_text().count('"POST /v1/chat/completions HTTP/1.1" 200')
    print(f"the server answered {served} chat completion(s)")
    assert served >= 1  # the shipped OpenAIChatGenerator reached the server through OPENAI_BASE_URL


def test_the_fresh_environment_runs_the_same_llama_cpp_build(fresh):
    out = run(
        [fresh["python"], "-c", "from haystack_fusion.backends import llama_cpp_runtime; print(llama_cpp_runtime())"],
        env=fresh["env"],
        cwd=fresh["cwd"],
    )
    assert out.strip().splitlines()[-1] == str(llama_cpp_runtime())


def test_ask_on_the_embedded_model_from_the_wheel(fresh, tmp_path):
    if not os.environ.get(SQUAD_VARIABLE):
        pytest.skip("$HAYSTACK_FUSION_SQUAD is unset and ../shared/data/squad2-dev-subset is not there")
    dataset = default_squad_path()
    cli, store = str(fresh["bin"] / "haystack-fusion"), str(tmp_path / "index.json")
    print(run([cli, "index", str(dataset), "--store", store], env=fresh["env"], cwd=tmp_path))
    out = run(
        [
            cli,
            "ask",
            load_squad(dataset)[1][0].question,  # read from ../shared at run time
            "--strategy",
            "concat_pf",
            "--top-k",
            "2",
            "--store",
            store,
            "--json",
        ],
        env=fresh["env"],
        cwd=tmp_path,
    )
    result = json.loads(out[out.index("{") :])
    print(json.dumps({key: result[key] for key in ("answer", "usage", "seconds")}))
    assert result["answer"].strip()
    assert result["sources"]
    assert result["usage"]["prompt_tokens"] > 0
