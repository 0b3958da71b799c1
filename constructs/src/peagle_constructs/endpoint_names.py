"""Names of endpoints and their inference components: SageMaker's rules, the default names, an endpoint's ARN.

One home for the rules, below everything that names an endpoint or a component: the bare endpoint, an import
by name, the composites' default names, a client's invoke arguments (:mod:`peagle_constructs.invocation`) and an
app's own environment configs (``check_endpoint_name``) all check them here.
"""

from __future__ import annotations

import re

from aws_cdk import Stack, Token
from constructs import Construct

from peagle_constructs.errors import ConfigError

_ENDPOINT_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
# CreateInferenceComponent's (and InvokeEndpoint's) InferenceComponentName: at most 63 characters.
_COMPONENT_NAME = re.compile(r"^[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?$")


def check_endpoint_name(name: object, field_name: str = "endpoint_name") -> str:
    """``name`` if SageMaker takes it as an endpoint name; a ConfigError naming ``field_name`` if not."""
    if isinstance(name, str) and Token.is_unresolved(name):
        return name  # another construct's attribute: SageMaker judges it at deploy time
    if not isinstance(name, str) or not _ENDPOINT_NAME.match(name):
        raise ConfigError(field_name, f"got {name!r}; allowed: 1-63 letters, digits and hyphens, "
                          "starting and ending with a letter or digit")
    return name


def check_component_name(name: object, field_name: str = "component_name") -> str:
    """``name`` if SageMaker takes it as an inference component's name; a ConfigError naming ``field_name`` if not."""
    if not isinstance(name, str) or len(name) > 63 or not _COMPONENT_NAME.match(name):
        raise ConfigError(field_name, f"got {name!r}; allowed: 1-63 letters, digits and hyphens, starting "
                          "and ending with a letter or digit")
    return name


def endpoint_name_for(scope: Construct, id: str, given: str | None) -> str:
    """``given`` checked, or by default ``<stack name>-<id>`` made a valid endpoint name: stable across
    deploys, unique within the account."""
    if given is not None:
        return check_endpoint_name(given)
    stack_name = Stack.of(scope).stack_name
    if Token.is_unresolved(stack_name):
        raise ConfigError("endpoint_name", "required when the stack name is not known at synth time")
    name = re.sub(r"[^A-Za-z0-9-]+", "-", f"{stack_name}-{id}").strip("-")
    return check_endpoint_name(re.sub(r"-{2,}", "-", name)[:63].rstrip("-"))


def stack_endpoint_arn(scope: Construct, endpoint_name: str) -> str:
    """The ARN of the endpoint ``endpoint_name`` in ``scope``'s account and region."""
    # SageMaker lower-cases endpoint names in ARNs.
    name = endpoint_name if Token.is_unresolved(endpoint_name) else endpoint_name.lower()
    return Stack.of(scope).format_arn(service="sagemaker", resource="endpoint", resource_name=name)
