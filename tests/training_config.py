"""A stage that trains its drafter in the cloud, for the tests: the committed stages train nowhere (no stage's
weights are pinned yet, and training starts from pinned weights only), so the tests pin one and turn it on."""

from __future__ import annotations

from dataclasses import replace

PIN = "ab" * 32


def trains(env, pin: str = PIN, **props):  # noqa: ANN001, ANN003, ANN201 - an EnvironmentConfig
    """``env`` with its weights pinned to ``pin`` and DrafterTraining on (``props``: DrafterTrainingProps')."""
    from peagle_constructs import DrafterTrainingProps

    from stacks.environments import bundle

    serving = replace(env.model.serving, **bundle(env.name.lower(), pin))
    return replace(env, model=replace(env.model, serving=serving), training=DrafterTrainingProps(**props))


def with_dev_training(environments, **props):  # noqa: ANN001, ANN003, ANN201
    """The stages with Dev (the stage that captures) training on a weekly schedule, the others as committed."""
    from aws_cdk import Duration
    from aws_cdk import aws_events as events

    props = {"schedule": events.Schedule.rate(Duration.days(7)), **props}
    return tuple(trains(env, **props) if env.name == "Dev" else env for env in environments)
