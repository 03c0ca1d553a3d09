"""
The uses of another library's internals that have no public equivalent, pinned to the version they were tested on:
llama-cpp-python 0.3.36 (`LLAMA_CPP_VERSION`) for the embedded model, Hayhooks 2.1.0 (`HAYHOOKS_VERSION`) for the
served apps. On another version each raises `PinnedVersionError` (and `test_pinned_llama_cpp_version` or
`test_pinned_hayhooks_version` fails by name). pyproject.toml requires exactly these versions (`PINNED_VERSIONS`;
tests/unit/test_packaging.py keeps the two equal), so pip installs no version this module refuses.

- `reuse_prefix`: llama-cpp-python reuses the KV cache of the prefix a prompt shares with the previous one from the
  first differing token, and llama.cpp's results depend on where a batch starts, so the reply would depend on the
  previous call. Cutting the reused prefix back to a batch boundary takes setting `Llama.n_tokens`.
- `load_llama`: llama.cpp's `use_extra_bufts` model parameter, which `Llama(...)` does not take, set on the
  parameters `Llama.__init__` assigns to `model_params` before it loads the model.
- `set_hayhooks_settings`: Hayhooks' `create_app`, `run_app` and chat UI take their configuration only from the
  process-wide `hayhooks.settings.settings`, read from `HAYHOOKS_*` once, when it is imported; the package writes no
  environment, so the served app's fields are set on that object.
- `hayhooks_mcp_app`: Hayhooks builds its MCP app with a fixed pipeline set only inside `hayhooks mcp run`, from
  `hayhooks.server.pipelines.loader` and `hayhooks.server.utils.mcp_utils`.
- `request_ids_outermost`, `with_request_ids`: Hayhooks' `RequestIdMiddleware` (`hayhooks.server.logger`) gives each
  request an id, binds it to loguru's context and sends it back as `X-Request-ID`; `create_app` puts it innermost,
  where requests the guards refuse never reach it, and the MCP app has none.
- `patch_hayhooks_run_log`: Hayhooks logs each run route's request body (`params`) at INFO with its module's
  `log` (`hayhooks.server.utils.deploy_utils`); a loguru patcher on that one logger changes those lines without
  configuring the process's loguru.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import version
from typing import Any

LLAMA_CPP_VERSION = "0.3.36"
"""The llama-cpp-python version whose internals this module was tested on."""

HAYHOOKS_VERSION = "2.1.0"
"""The Hayhooks version whose internals this module was tested on."""

PINNED_VERSIONS = {"llama-cpp-python": LLAMA_CPP_VERSION, "hayhooks": HAYHOOKS_VERSION}
"""Each distribution this module uses internals of, and the one version of it pyproject.toml requires."""


class PinnedVersionError(RuntimeError):
    """An installed library is not the version this module's uses of its internals were tested on."""


def _check_llama_cpp() -> Any:
    import llama_cpp

    if llama_cpp.__version__ != LLAMA_CPP_VERSION:
        raise PinnedVersionError(
            f"haystack_fusion.backends.pinned was tested on llama-cpp-python {LLAMA_CPP_VERSION}, and "
            f"{llama_cpp.__version__} is installed: install llama-cpp-python=={LLAMA_CPP_VERSION} (the version "
            "haystack-fusion's `local` extra requires; `make install-llama-cpp` builds it), or use "
            "`prefix_cache=False`. To support another version, check `Llama.generate`'s prefix reuse (`n_tokens`) and "
            "`Llama.__init__`'s `model_params`, then update LLAMA_CPP_VERSION and pyproject.toml's pins"
        )
    return llama_cpp


def reuse_prefix(llama: Any, tokens: Sequence[int], n_batch: int) -> int:
    """
    Keep the KV cache of the prefix `tokens` share with the loaded context, cut back to a multiple of `n_batch`, so
    that the next `create_completion(tokens)` evaluates the rest in the batches of a fresh evaluation: the same
    logits bit for bit. The last token is always evaluated again (its logits are sampled from).

    :param llama: A loaded `llama_cpp.Llama`.
    :param tokens: The prompt's tokens.
    :param n_batch: The context's batch size, in tokens.
    :returns: The prompt tokens kept, a multiple of `n_batch` (0: the context starts from scratch).
    :raises PinnedVersionError: On another llama-cpp-python version.
    """
    _check_llama_cpp()
    shared = llama.longest_token_prefix(llama.input_ids[: llama.n_tokens], tokens[:-1])
    kept = shared - shared % n_batch
    if kept == 0:
        llama.reset()
    else:
        llama.n_tokens = kept  # `generate` then reuses exactly these and drops the KV cache after them
    return kept


def load_llama(*, use_extra_bufts: bool, **kwargs: Any) -> Any:
    """
    `llama_cpp.Llama(**kwargs)` with llama.cpp's `use_extra_bufts` model parameter set.

    :param use_extra_bufts: Load the weights into llama.cpp's extra CPU buffer types (repacked kernels).
    :param kwargs: `Llama` arguments.
    :returns: The loaded `llama_cpp.Llama`.
    :raises PinnedVersionError: On another llama-cpp-python version.
    """
    llama_cpp = _check_llama_cpp()

    class _Llama(llama_cpp.Llama):  # type: ignore[misc,name-defined]
        @property
        def model_params(self) -> Any:
            return self.__dict__["model_params"]

        @model_params.setter
        def model_params(self, params: Any) -> None:
            params.use_extra_bufts = use_extra_bufts
            self.__dict__["model_params"] = params

    return _Llama(**kwargs)


def _check_hayhooks() -> None:
    installed = version("hayhooks")
    if installed != HAYHOOKS_VERSION:
        raise PinnedVersionError(
            f"haystack_fusion.backends.pinned was tested on hayhooks {HAYHOOKS_VERSION}, and {installed} is "
            f"installed: install hayhooks=={HAYHOOKS_VERSION} (the version haystack-fusion's `serve` extra requires: "
            f'pip install "hayhooks[mcp]=={HAYHOOKS_VERSION}"). To support another version, check the fields of '
            "`hayhooks.settings.AppSettings` it sets, `hayhooks mcp run`'s app (`build_immutable_host`, "
            "`create_mcp_server`, `create_starlette_app`), `RequestIdMiddleware` and the `log` of "
            "`hayhooks.server.utils.deploy_utils`, then update HAYHOOKS_VERSION and pyproject.toml's pins"
        )


def set_hayhooks_settings(**fields: Any) -> Any:
    """
    Set fields of Hayhooks' `settings`, which its `create_app`, `run_app` and chat UI read when they run.

    :param fields: `hayhooks.settings.AppSettings` field names and values.
    :returns: Hayhooks' `settings`, to read.
    :raises PinnedVersionError: On another Hayhooks version.
    """
    _check_hayhooks()
    from hayhooks.settings import settings

    for name, value in fields.items():
        setattr(settings, name, value)
    return settings


def hayhooks_mcp_app(pipelines_dir: str) -> Any:
    """
    Hayhooks' MCP app (Starlette: `/mcp` and `/sse`) serving the pipelines of a folder, loaded once, no deploy tool.

    :raises PinnedVersionError: On another Hayhooks version.
    :raises hayhooks.server.exceptions.PipelineModuleLoadError: If a pipeline fails to load or set up.
    """
    _check_hayhooks()
    from hayhooks.server.pipelines.loader import build_immutable_host
    from hayhooks.server.utils.mcp_utils import create_mcp_server, create_starlette_app

    return build_immutable_host(
        pipelines_dir, lambda registry: create_starlette_app(create_mcp_server(registry=registry))
    )


def request_ids_outermost(app: Any) -> None:
    """
    Move Hayhooks' `RequestIdMiddleware` of an app from Hayhooks' `create_app` to its outermost layer (added last),
    so that every request, the refused ones too, gets an id in loguru's context and an `X-Request-ID`.

    :param app: The FastAPI app, before it starts.
    :raises PinnedVersionError: On another Hayhooks version.
    """
    _check_hayhooks()
    from hayhooks.server.logger import RequestIdMiddleware

    app.user_middleware = [entry for entry in app.user_middleware if entry.cls is not RequestIdMiddleware]
    app.add_middleware(RequestIdMiddleware)


def with_request_ids(app: Any) -> Any:
    """
    An ASGI app behind Hayhooks' `RequestIdMiddleware`: an id per request in loguru's context and `X-Request-ID`.

    :raises PinnedVersionError: On another Hayhooks version.
    """
    _check_hayhooks()
    from hayhooks.server.logger import RequestIdMiddleware

    return RequestIdMiddleware(app)


_RUN_LOGS: dict[str, Any] = {}  # Hayhooks' own `deploy_utils.log`, kept to patch it afresh


def patch_hayhooks_run_log(patcher: Any) -> None:
    """
    Apply a loguru patcher to the records of Hayhooks' run routes (`Running pipeline ...` with the request body as
    `params`), and to no other: the process's loguru configuration (handlers, levels, global patcher) stays as it is.
    Patching again replaces the patcher.

    :param patcher: Called with each record (a dict) before loguru's handlers see it.
    :raises PinnedVersionError: On another Hayhooks version.
    """
    _check_hayhooks()
    from hayhooks.server.utils import deploy_utils

    original = _RUN_LOGS.setdefault("log", deploy_utils.log)
    deploy_utils.log = original.patch(patcher)
