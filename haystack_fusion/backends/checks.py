"""Whether the environment's backend can run (extras, variables, servers: serving refuses to start on one that fails
rather than pick another), and whether a server sends the token log-probabilities asked for (`missing_logprobs`)."""

from __future__ import annotations

import importlib.util
import json
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

from haystack import logging
from haystack.dataclasses import GeneratedAnswer

from haystack_fusion.backends.config import DEFAULT_MODELS, BackendConfig
from haystack_fusion.backends.errors import OPENAI_DEFAULT_URL, safe_url
from haystack_fusion.settings import DOCUMENT_STORE_VARIABLE, LLM_VARIABLE, STORE_VARIABLE

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_SECONDS = 5.0
"""How long `check_backend` waits for Elasticsearch or Ollama to answer, in seconds."""


class BackendSetupError(RuntimeError):
    """The environment configures no backend that can run; the message lists what is missing."""


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _probe(url: str) -> str | None:
    """GET `url`; None when a server answered (any HTTP status), else why it could not be reached."""
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_SECONDS):
            return None
    except urllib.error.HTTPError:
        return None  # it answered (401 without credentials, ...): reachable
    except (urllib.error.URLError, OSError, ValueError) as error:
        return str(getattr(error, "reason", error))


def _ollama_models(url: str) -> tuple[list[str] | None, str | None]:
    """The models pulled on an Ollama server (`GET /api/tags`), or why they could not be listed."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/api/tags", timeout=PROBE_TIMEOUT_SECONDS) as response:
            return [model.get("name", "") for model in json.load(response).get("models", [])], None
    except (urllib.error.URLError, OSError, ValueError) as error:
        return None, str(getattr(error, "reason", error))


EXTRA_MODULES = {  # the module each optional extra installs
    "local": "llama_cpp",
    "ollama": "haystack_integrations.components.generators.ollama",
    "elasticsearch": "haystack_integrations.document_stores.elasticsearch",
    "dense": "haystack_integrations.components.embedders.sentence_transformers",
}


def _presence_problems(config: BackendConfig, env: Mapping[str, str]) -> list[str]:
    """What the LLM, the store and the retriever lack: extras, variables, the saved index."""
    problems: list[str] = []

    def extra(setting: str, name: str, what: str = "") -> None:
        if not _has_module(EXTRA_MODULES[name]):
            problems.append(f"{setting} needs the `{name}` extra{what}: pip install 'haystack-fusion[{name}]'")

    llm = f"HAYSTACK_FUSION_LLM={config.llm}"
    if config.llm == "local":
        extra(llm, "local")
    elif config.llm == "openai" and not env.get("OPENAI_API_KEY"):
        problems.append(
            f"{llm} needs OPENAI_API_KEY (any value for an OpenAI-compatible server that takes none; its URL in "
            "OPENAI_BASE_URL)"
        )
    elif config.llm == "ollama":
        extra(llm, "ollama")
        if not env.get("OLLAMA_HOST"):
            problems.append(f"{llm} needs OLLAMA_HOST, the server's URL (http://localhost:11434)")
    path = env.get(STORE_VARIABLE)
    if config.store == "memory" and not path:
        problems.append(
            "HAYSTACK_FUSION_DOCUMENT_STORE=memory needs HAYSTACK_FUSION_STORE, a saved index "
            "(`haystack-fusion index PASSAGES --store index.json`)"
        )
    elif config.store == "memory" and not os.path.isfile(os.path.expanduser(str(path))):
        problems.append(
            f"HAYSTACK_FUSION_STORE={path}: no saved index there (`haystack-fusion index PASSAGES --store {path}`)"
        )
    elif config.store == "elasticsearch":
        extra("HAYSTACK_FUSION_DOCUMENT_STORE=elasticsearch", "elasticsearch")
        if not env.get("ELASTICSEARCH_URL"):
            problems.append("HAYSTACK_FUSION_DOCUMENT_STORE=elasticsearch needs ELASTICSEARCH_URL, the cluster's URL")
    retriever = f"HAYSTACK_FUSION_RETRIEVER={config.retriever}"
    if config.retriever != "bm25" and config.embedder == "openai" and not env.get("OPENAI_API_KEY"):
        problems.append(f"{retriever} with the openai embedder needs OPENAI_API_KEY")
    elif config.retriever != "bm25" and config.embedder == "packaged":
        extra(retriever, "dense", " (the packaged embedding model)")
    return problems


def reachability_problems(config: BackendConfig) -> list[str]:
    """Whether Elasticsearch (any HTTP status) and Ollama (with the model pulled) answer (OpenAI is not called): a
    line per problem, naming the variable and URL."""
    problems = []
    if config.llm == "ollama":
        url = safe_url(config.ollama_url)
        model = config.model or DEFAULT_MODELS["ollama"]
        models, error = _ollama_models(config.ollama_url)
        if models is None:
            problems.append(f"Ollama is not reachable at OLLAMA_HOST={url}: {error}")
        elif model not in models and f"{model}:latest" not in models:
            problems.append(
                f"Ollama at {url} has no model {model!r}: `ollama pull {model}`, or set "
                f"HAYSTACK_FUSION_MODEL to one it has ({', '.join(models) or 'none pulled'})"
            )
    # without user and password: urllib takes them for part of the host name (the cluster's 401 counts as an answer)
    url = safe_url(config.elasticsearch_url)
    if config.store == "elasticsearch" and (error := _probe(url)) is not None:
        problems.append(f"Elasticsearch is not reachable at ELASTICSEARCH_URL={url}: {error}")
    return problems


def check_backend(*, probe: bool = True, env: Mapping[str, str] | None = None) -> BackendConfig:
    """The backend `env` (default `os.environ`) configures, never a default one, as `BackendConfig.from_env(env)`, its
    extras and variables checked before anything is built (with `probe`, `reachability_problems` too); else
    BackendSetupError listing every problem, a line each, naming the variable or extra."""
    env = os.environ if env is None else env
    kinds = {
        LLM_VARIABLE: "local (the embedded model), openai (OPENAI_API_KEY) or ollama (OLLAMA_HOST)",
        DOCUMENT_STORE_VARIABLE: "memory (a saved index at HAYSTACK_FUSION_STORE) or elasticsearch (ELASTICSEARCH_URL)",
    }
    missing = [f"{name} is not set: {kind}" for name, kind in kinds.items() if not env.get(name)]
    if missing:
        raise BackendSetupError(setup_message(missing))
    try:
        config = BackendConfig.from_env(env)
    except ValueError as error:
        raise BackendSetupError(setup_message([str(error)])) from error
    problems = _presence_problems(config, env)
    if probe and not problems:
        problems = reachability_problems(config)
    if problems:
        raise BackendSetupError(setup_message(problems))
    return config


def setup_message(problems: list[str]) -> str:
    """The `BackendSetupError` message, a problem a line."""
    lines = "\n".join(f"- {problem}" for problem in problems)
    return f"The backend is not configured (see docs/serving.md); haystack-fusion does not pick one for you:\n{lines}"


_warned: set[str] = set()
_lock = threading.Lock()


def missing_logprobs(generator: Any, answers: Iterable[GeneratedAnswer]) -> str | None:
    """Whether a server sent no token log-probabilities although `generator` asked for them: an answer of one reply
    (with a `finish_reason`) without `meta["logprobs"]` shows it. None, or a line naming the server and the request."""
    kwargs = getattr(generator, "generation_kwargs", None) or {}
    asked = {name: kwargs[name] for name in ("logprobs", "top_logprobs") if name in kwargs}
    if not kwargs.get("logprobs") or all("finish_reason" not in a.meta or a.meta.get("logprobs") for a in answers):
        return None
    server = safe_url(getattr(generator, "api_base_url", None) or OPENAI_DEFAULT_URL)
    return (
        f"the OpenAI-compatible server at {server} returned no token log-probabilities although the requests asked "
        f"for them ({json.dumps(asked)}): answers carry no confidence, so a confidence threshold (tau, "
        "--min-confidence) never routes a question"
    )


def warn_missing_logprobs(generator: Any, answers: Iterable[GeneratedAnswer]) -> str | None:
    """`missing_logprobs`, logged once per process per message; returned every time it applies."""
    message = missing_logprobs(generator, answers)
    if message is not None:
        with _lock:
            first = message not in _warned
            _warned.add(message)
        if first:
            logger.warning("{message}", message=message)
    return message
