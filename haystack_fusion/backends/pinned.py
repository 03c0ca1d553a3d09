"""The uses of other libraries' internals that have no public equivalent, pinned to the versions they were tested on
(`PINNED_VERSIONS`, which pyproject.toml requires exactly): each raises `PinnedVersionError` on another version."""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import version
from typing import Any

LLAMA_CPP_VERSION = "0.3.36"
HAYHOOKS_VERSION = "2.1.0"
PINNED_VERSIONS = {"llama-cpp-python": LLAMA_CPP_VERSION, "hayhooks": HAYHOOKS_VERSION}
"""Each distribution this module uses internals of, and the one version of it pyproject.toml requires."""


class PinnedVersionError(RuntimeError):
    """An installed library is not the version this module's uses of its internals were tested on."""


def _check(name: str, installed: str, hint: str) -> None:
    pinned = PINNED_VERSIONS[name]
    if installed != pinned:
        raise PinnedVersionError(
            f"haystack_fusion.backends.pinned was tested on {name} {pinned}, and {installed} is installed: install "
            f"{name}=={pinned} ({hint}). To support another version, check the internals its functions' docstrings "
            "name, then update PINNED_VERSIONS and pyproject.toml's pins"
        )


def _check_llama_cpp() -> Any:
    import llama_cpp

    hint = "the `local` extra's version, built by `make install-llama-cpp`; or use `prefix_cache=False`"
    _check("llama-cpp-python", llama_cpp.__version__, hint)
    return llama_cpp


def reuse_prefix(llama: Any, tokens: Sequence[int], n_batch: int) -> int:
    """Keep the KV cache of the prefix `tokens` share with the loaded context, cut to a multiple of `n_batch` (setting
    `Llama.n_tokens`), so the next `create_completion(tokens)` evaluates the rest in a fresh evaluation's batches: the
    same logits bit for bit. Returns the tokens kept (0: from scratch); the last token is always evaluated again."""
    _check_llama_cpp()
    shared = llama.longest_token_prefix(llama.input_ids[: llama.n_tokens], tokens[:-1])
    kept = shared - shared % n_batch
    if kept == 0:
        llama.reset()
    else:
        llama.n_tokens = kept  # `generate` then reuses exactly these and drops the KV cache after them
    return kept


def load_llama(*, use_extra_bufts: bool, **kwargs: Any) -> Any:
    """`llama_cpp.Llama(**kwargs)` with llama.cpp's `use_extra_bufts`, which `Llama` does not take, set on the
    `model_params` `Llama.__init__` assigns before it loads the model."""
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
    hint = f'the `serve` extra\'s version: pip install "hayhooks[mcp]=={HAYHOOKS_VERSION}"'
    _check("hayhooks", version("hayhooks"), hint)


def set_hayhooks_settings(**fields: Any) -> Any:
    """Set fields of Hayhooks' process-wide `hayhooks.settings.settings` (read from `HAYHOOKS_*` once, at import; its
    `create_app`, `run_app` and chat UI read nothing else), and return it."""
    _check_hayhooks()
    from hayhooks.settings import settings

    for name, value in fields.items():
        setattr(settings, name, value)
    return settings


def hayhooks_mcp_app(pipelines_dir: str) -> Any:
    """Hayhooks' MCP app (`/mcp` and `/sse`) serving a folder's pipelines, no deploy tool, as only `hayhooks mcp run`
    builds it (`build_immutable_host`); `PipelineModuleLoadError` if a pipeline fails to load."""
    _check_hayhooks()
    from hayhooks.server.pipelines.loader import build_immutable_host
    from hayhooks.server.utils.mcp_utils import create_mcp_server, create_starlette_app

    return build_immutable_host(
        pipelines_dir, lambda registry: create_starlette_app(create_mcp_server(registry=registry))
    )


def request_ids_outermost(app: Any) -> None:
    """Move Hayhooks' `RequestIdMiddleware` (`X-Request-ID`, in loguru's context) from innermost, where `create_app`
    puts it, to outermost, so requests the guards refuse get an id too."""
    _check_hayhooks()
    from hayhooks.server.logger import RequestIdMiddleware

    app.user_middleware = [entry for entry in app.user_middleware if entry.cls is not RequestIdMiddleware]
    app.add_middleware(RequestIdMiddleware)


def with_request_ids(app: Any) -> Any:
    """An ASGI app (the MCP app, which has none) behind Hayhooks' `RequestIdMiddleware`."""
    _check_hayhooks()
    from hayhooks.server.logger import RequestIdMiddleware

    return RequestIdMiddleware(app)


_RUN_LOGS: dict[str, Any] = {}  # Hayhooks' own `deploy_utils.log`, kept to patch it afresh


def patch_hayhooks_run_log(patcher: Any) -> None:
    """Apply a loguru patcher to the records of Hayhooks' run routes (`deploy_utils.log`, the request body as `params`)
    and no other; applied again, it replaces the earlier one."""
    _check_hayhooks()
    from hayhooks.server.utils import deploy_utils

    original = _RUN_LOGS.setdefault("log", deploy_utils.log)
    deploy_utils.log = original.patch(patcher)
