"""An endpoint as other constructs use it: its name and ARN, invoke permission, and SageMaker's metrics of it.

:class:`EndpointBase` is what every endpoint here has - the ones this library creates and one deployed
elsewhere (another stack, another account) that :meth:`EndpointBase.from_endpoint_name` or
:meth:`EndpointBase.from_endpoint_arn` references. ``metric_*`` take the options CDK's own metric methods
take (``period``, ``statistic``, ``label``, ``unit``, ``color``, ``account``, ``region``, ...).
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping

from aws_cdk import Arn, ArnFormat, Duration, Stack, Token
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from constructs import Construct

from peagle_constructs.errors import ConfigError
from peagle_constructs.sagemaker_names import DEFAULT_VARIANT_NAME, INVOCATION_METRICS_NAMESPACE

INVOKE_ACTIONS = ("sagemaker:InvokeEndpoint", "sagemaker:InvokeEndpointWithResponseStream")
# What CloudWatch metrics of an endpoint default to when a caller gives no period (CDK's own default).
DEFAULT_METRIC_PERIOD = Duration.minutes(5)
METRIC_OPTIONS = frozenset(inspect.signature(cloudwatch.MetricOptions.__init__).parameters) - {"self"}
EXPRESSION_OPTIONS = frozenset(inspect.signature(cloudwatch.MathExpressionOptions.__init__).parameters) - {"self"}


def _options(options: Mapping[str, Any], allowed: frozenset[str], what: str) -> dict[str, Any]:
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ConfigError("metric options", f"got {unknown} for {what}; allowed: {sorted(allowed)}")
    return {key: value for key, value in options.items() if value is not None}


def metric(namespace: str, metric_name: str, dimensions: Mapping[str, str], defaults: Mapping[str, Any],
           options: Mapping[str, Any]) -> cloudwatch.Metric:
    """A CloudWatch metric: ``defaults`` (statistic, period, ...) overridden by the caller's ``options``;
    ``options["dimensions_map"]`` adds to ``dimensions``."""
    merged = {**defaults, **_options(options, METRIC_OPTIONS, metric_name)}
    dimensions = {**dimensions, **(merged.pop("dimensions_map", None) or {})}
    if dimensions:
        merged["dimensions_map"] = dimensions
    return cloudwatch.Metric(namespace=namespace, metric_name=metric_name, **merged)


def expression_options(options: Mapping[str, Any], what: str) -> dict[str, Any]:
    """The options a metric-math expression takes (``period``, ``label``, ``color``, ...), checked."""
    return _options(options, EXPRESSION_OPTIONS, what)


class InvocationMetrics:
    """SageMaker's invocation metrics (AWS/SageMaker) of what ``_invocation_metric`` selects: an endpoint's
    variant, or an inference component."""

    def _invocation_metric(self, metric_name: str, statistic: str, options: Mapping[str, Any]) -> cloudwatch.Metric:
        raise NotImplementedError

    def metric_invocations(self, **options: Any) -> cloudwatch.Metric:
        return self._invocation_metric("Invocations", "Sum", options)

    def metric_model_latency(self, **options: Any) -> cloudwatch.Metric:
        """Whole-request latency in microseconds, as SageMaker reports it (default p99)."""
        return self._invocation_metric("ModelLatency", "p99", options)

    def metric_invocation_5xx_errors(self, **options: Any) -> cloudwatch.Metric:
        return self._invocation_metric("Invocation5XXErrors", "Sum", options)

    def metric_invocation_4xx_errors(self, **options: Any) -> cloudwatch.Metric:
        return self._invocation_metric("Invocation4XXErrors", "Sum", options)

    def metric_invocation_model_errors(self, **options: Any) -> cloudwatch.Metric:
        return self._invocation_metric("InvocationModelErrors", "Sum", options)


class EndpointBase(InvocationMetrics, Construct):
    """A SageMaker real-time endpoint: ``endpoint_name``, ``endpoint_arn``, ``variant_name``, invoke grants and
    SageMaker's invocation metrics (namespace AWS/SageMaker, by endpoint and variant)."""

    endpoint_name: str
    endpoint_arn: str
    variant_name: str

    @classmethod
    def from_endpoint_name(cls, scope: Construct, id: str, endpoint_name: str, *,
                           variant_name: str = DEFAULT_VARIANT_NAME) -> "EndpointBase":
        """An endpoint that exists already, in this stack's account and region."""
        from peagle_constructs.endpoint import check_endpoint_name

        return _ImportedEndpoint(scope, id, endpoint_name=check_endpoint_name(endpoint_name), variant_name=variant_name,
                                 endpoint_arn=endpoint_arn(scope, endpoint_name))

    @classmethod
    def from_endpoint_arn(cls, scope: Construct, id: str, endpoint_arn: str, *,
                          variant_name: str = DEFAULT_VARIANT_NAME) -> "EndpointBase":
        """An endpoint that exists already, by ARN (another account or region too).

        ARNs hold the name lower-cased, and CloudWatch's dimensions keep the name's own case: for an endpoint
        whose name has capitals, take :meth:`from_endpoint_name`, or the metrics will find nothing.
        """
        if not Token.is_unresolved(endpoint_arn):
            parts = str(endpoint_arn).split(":")
            if len(parts) != 6 or parts[0] != "arn" or parts[2] != "sagemaker" or not parts[5].startswith("endpoint/"):
                raise ConfigError("endpoint_arn", f"got {endpoint_arn!r}; allowed: "
                                  "'arn:<partition>:sagemaker:<region>:<account>:endpoint/<name>'")
        name = Arn.split(endpoint_arn, ArnFormat.SLASH_RESOURCE_NAME).resource_name
        return _ImportedEndpoint(scope, id, endpoint_name=name, variant_name=variant_name, endpoint_arn=endpoint_arn)

    def grant_invoke(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` call InvokeEndpoint and InvokeEndpointWithResponseStream on this endpoint only (CDK
        adds the statement to the grantee's default, inline, policy)."""
        return iam.Grant.add_to_principal(grantee=grantee, actions=list(INVOKE_ACTIONS),
                                          resource_arns=[self.endpoint_arn])

    def invoke_statement(self) -> iam.PolicyStatement:
        """The same permission as a statement, for a managed policy of your own (where a rule pack such as
        NIST 800-53 refuses inline policies)."""
        return iam.PolicyStatement(actions=list(INVOKE_ACTIONS), resources=[self.endpoint_arn])

    # -- SageMaker's invocation metrics of the variant ------------------------------------------------
    def _metric_defaults(self) -> dict[str, Any]:
        return {"period": DEFAULT_METRIC_PERIOD}

    def _metric_dimensions(self) -> dict[str, str]:
        return {"EndpointName": self.endpoint_name, "VariantName": self.variant_name}

    def metric(self, metric_name: str, **options: Any) -> cloudwatch.Metric:
        """Any metric SageMaker publishes in AWS/SageMaker for this variant (default statistic Average)."""
        return metric(INVOCATION_METRICS_NAMESPACE, metric_name, self._metric_dimensions(),
                      {"statistic": "Average", **self._metric_defaults()}, options)

    def _invocation_metric(self, metric_name: str, statistic: str, options: Mapping[str, Any]) -> cloudwatch.Metric:
        return self.metric(metric_name, **{"statistic": statistic, **options})


class _ImportedEndpoint(EndpointBase):
    def __init__(self, scope: Construct, id: str, *, endpoint_name: str, variant_name: str, endpoint_arn: str) -> None:
        super().__init__(scope, id)
        self.endpoint_name, self.variant_name, self.endpoint_arn = endpoint_name, variant_name, endpoint_arn


def endpoint_arn(scope: Construct, endpoint_name: str) -> str:
    """The ARN of the endpoint ``endpoint_name`` in ``scope``'s account and region."""
    # SageMaker lower-cases endpoint names in ARNs.
    name = endpoint_name if Token.is_unresolved(endpoint_name) else endpoint_name.lower()
    return Stack.of(scope).format_arn(service="sagemaker", resource="endpoint", resource_name=name)
