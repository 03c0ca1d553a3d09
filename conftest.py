"""The repository's root conftest: loads the plugin that runs README.md's and docs/'s code blocks as tests."""

import os

# before the plugin imports Haystack, which reads this once: no telemetry from the tests (the machine is offline, and
# its client's retries would log warnings into tests that assert there are none)
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

pytest_plugins = ["tests.docs.blocks"]
