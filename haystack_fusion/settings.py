"""
Who may reach a served app (`haystack_fusion.serving.app`): its API key and the web origins allowed to call it,
read from the environment.

| variable | default | what |
|---|---|---|
| `HAYSTACK_FUSION_API_KEY` | unset: no key | every route but `GET /status` needs `Authorization: Bearer <key>` |
| `HAYSTACK_FUSION_CORS_ORIGINS` | unset: none | comma-separated origins (`https://app.example.com`) allowed by CORS |

Needs no extra.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

API_KEY_VARIABLE = "HAYSTACK_FUSION_API_KEY"
CORS_ORIGINS_VARIABLE = "HAYSTACK_FUSION_CORS_ORIGINS"

_ORIGIN = re.compile(r"https?://[^/\s*]+")
"""A web origin: scheme, host and optional port, no path and no wildcard."""


@dataclass(frozen=True)
class AccessSettings:
    """
    Who may reach a served app.

    :param api_key: The key every route but `GET /status` requires (`Authorization: Bearer <key>`); None: no key.
    :param cors_origins: Web origins whose pages may call the app from a browser (CORS), each `scheme://host[:port]`;
        empty: none (the embedded chat UI is the app's own origin and needs none).
    :raises ValueError: If the key is empty or holds whitespace, or an origin is not `scheme://host[:port]` (a
        wildcard `*` included).
    """

    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.api_key is not None and (not self.api_key or any(char.isspace() for char in self.api_key)):
            raise ValueError("The API key must be a non-empty string without whitespace")
        for origin in self.cors_origins:
            if not _ORIGIN.fullmatch(origin):
                raise ValueError(
                    f"{origin!r} is not a web origin: give scheme, host and optional port, e.g. "
                    "https://app.example.com (no path, no wildcard)"
                )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AccessSettings:
        """
        The settings `HAYSTACK_FUSION_API_KEY` and `HAYSTACK_FUSION_CORS_ORIGINS` give (an empty value counts as
        unset; surrounding whitespace is dropped).

        :param env: The environment (default `os.environ`).
        :raises ValueError: As the constructor, naming the variable.
        """
        env = os.environ if env is None else env
        key = env.get(API_KEY_VARIABLE, "").strip() or None
        origins = tuple(
            origin.strip().rstrip("/") for origin in env.get(CORS_ORIGINS_VARIABLE, "").split(",") if origin.strip()
        )
        try:
            return cls(api_key=key, cors_origins=origins)
        except ValueError as error:
            variable = API_KEY_VARIABLE if "key" in str(error) else CORS_ORIGINS_VARIABLE
            raise ValueError(f"{variable}: {error}") from None
