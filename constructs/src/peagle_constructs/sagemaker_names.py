"""Names SageMaker itself uses for an endpoint's logs and metrics (shared by the model, monitoring and security)."""

from __future__ import annotations

# Where SageMaker's hosting agent writes container output: one log group per endpoint below this prefix.
ENDPOINT_LOG_GROUP_PREFIX = "/aws/sagemaker/Endpoints/"
# Instance metrics (GPU utilisation, memory) are published here under the execution role.
ENDPOINT_METRICS_NAMESPACE = "/aws/sagemaker/Endpoints"
# Invocation metrics (Invocations, ModelLatency, 4XX/5XX errors) per endpoint and variant.
INVOCATION_METRICS_NAMESPACE = "AWS/SageMaker"
# An inference component's container output goes to a group of its own (AWS's pages do not say so; the
# groups real accounts hold do), and its utilisation metrics, normalised to what the component reserved, here.
COMPONENT_LOG_GROUP_PREFIX = "/aws/sagemaker/InferenceComponents/"
COMPONENT_METRICS_NAMESPACE = "/aws/sagemaker/InferenceComponents"
# The variant name SageMaker's own examples and tools use for an endpoint's one production variant.
DEFAULT_VARIANT_NAME = "AllTraffic"


def container_log_group(endpoint: str, component: str | None = None) -> str:
    """The log group a container's output lands in: its component's when it is one, else its endpoint's."""
    return f"{COMPONENT_LOG_GROUP_PREFIX}{component}" if component else f"{ENDPOINT_LOG_GROUP_PREFIX}{endpoint}"
