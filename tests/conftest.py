"""Shared test settings: no telemetry from Haystack's test runs (the machines have no internet anyway)."""

import os

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
