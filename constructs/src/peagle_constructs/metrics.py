"""CloudWatch metrics as every ``metric_*`` of this library builds them, and SageMaker's invocation metrics.

``metric_*`` take the options CDK's own metric methods take (``period``, ``statistic``, ``label``, ``unit``,
``color``, ``account``, ``region``, ...); an option CDK does not know is refused by name. Endpoints
(:mod:`peagle_constructs.endpoint_base`) and their monitoring (:mod:`peagle_constructs.serving_metrics`) share it.
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch

from peagle_constructs.errors import ConfigError

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
