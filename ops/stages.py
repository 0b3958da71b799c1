"""A stage's config by the name an operator types (``--env dev``): stacks.environments is the one list."""

from __future__ import annotations


class StageNameError(ValueError):
    pass


def find_stage(env: str):  # noqa: ANN201 - an EnvironmentConfig
    """The environment named ``env`` (case-insensitive), or StageNameError listing the names there are."""
    from stacks.environments import ENVIRONMENTS

    for config in ENVIRONMENTS:
        if config.name.lower() == str(env).lower():
            return config
    raise StageNameError(f"--env: got {str(env)[:40]!r}; allowed: {', '.join(c.name for c in ENVIRONMENTS)}")
