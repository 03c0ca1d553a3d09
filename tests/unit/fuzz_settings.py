"""
The hypothesis settings of the fuzzing tests: the "fuzz-ci" profile (few examples, no deadline: the machine is shared
and noisy) unless `FUZZ_PROFILE` names another ("fuzz-10k", "fuzz-50k"). Applied per test, so the other tests keep
hypothesis' default profile.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_NO_HEALTH_CHECKS = list(HealthCheck)
settings.register_profile("fuzz-ci", max_examples=25, deadline=None, suppress_health_check=_NO_HEALTH_CHECKS)
settings.register_profile("fuzz-10k", max_examples=10_000, deadline=None, suppress_health_check=_NO_HEALTH_CHECKS)
settings.register_profile("fuzz-50k", max_examples=50_000, deadline=None, suppress_health_check=_NO_HEALTH_CHECKS)

FUZZ = settings(settings.get_profile(os.environ.get("FUZZ_PROFILE", "fuzz-ci")))

HUGE = settings(FUZZ, max_examples=min(FUZZ.max_examples, 2))
