"""Shared test setup: hypothesis profiles.

HYPOTHESIS_PROFILE=ci (the default, and what .ci/run uses) is derandomized
with a bounded number of examples, so CI is repeatable and fast;
HYPOTHESIS_PROFILE=dev explores many more examples for local runs.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=15, derandomize=True, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
