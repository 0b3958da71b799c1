"""An embedded AWS for the daily loop: moto plus the CloudFormation types moto skips.

``register()`` makes moto's CloudFormation create and delete scalable targets, scaling policies, alarms,
metric filters, SNS topic policies and subscriptions (cfn_types.py); adds SageMaker inference components, which
moto lacks: a store, their API actions and their CloudFormation type (inference_components.py, cfn_types.py);
and fixes the places where moto's own models break our stacks: GPU instance types, fixed SageMaker names,
tagged KMS keys, managed-policy deletion, endpoint configs without a model, copy-count autoscaling
(moto_patches.py); see NOTES.md. ``server`` runs ``moto_server`` on loopback with the extension loaded,
for the real CDK CLI.
"""

from __future__ import annotations

EXTENDED_TYPES = (
    "AWS::ApplicationAutoScaling::ScalableTarget",
    "AWS::ApplicationAutoScaling::ScalingPolicy",
    "AWS::CloudWatch::Alarm",
    "AWS::Logs::MetricFilter",
    "AWS::SNS::TopicPolicy",
    "AWS::SNS::Subscription",
    "AWS::SageMaker::InferenceComponent",
)


def register() -> tuple[str, ...]:
    """Load the extension into moto in this process; return the types now handled. Safe to call twice."""
    from moto.cloudformation import parsing

    from harness.aws import cfn_types, inference_components, moto_patches

    moto_patches.install()
    inference_components.install()

    # moto caches its type map on first use (functools.lru_cache): a stack parsed before our classes were
    # defined would keep the old map, so drop the caches after defining them.
    for cached in (parsing.get_model_list, parsing.get_model_map, parsing.get_name_type_map):
        cached.cache_clear()
    known = parsing.get_model_map()
    missing = [t for t in EXTENDED_TYPES if known.get(t) not in cfn_types.EXTENSION_TYPES]
    if missing:
        raise RuntimeError(f"moto did not pick up the extension types {missing}; is another model registered for them?")
    return EXTENDED_TYPES
