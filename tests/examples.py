"""How many examples a Hypothesis generator that runs the real CLI draws (each one is a `torchboost` command,
~0.5 s): 30 under CI's fixed-seed profile, to keep `make test` inside its 10 minutes; under any other profile
(`--hypothesis-profile=soak-cli`: 600, an hour's hunt) the profile's own count."""

from __future__ import annotations

from hypothesis import settings

CI_CLI_EXAMPLES = 30


def cli_generator(test):
    """`test` (a @given test) at CI_CLI_EXAMPLES examples when the CI profile is loaded; unchanged otherwise.
    Applied above @given: hypothesis reads the settings on the wrapped test."""
    if settings.default == settings.get_profile("ci"):
        return settings(max_examples=CI_CLI_EXAMPLES)(test)
    return test
