"""The metrics of one endpoint variant or inference component: its request lines' and SageMaker's own.

Request lines: what the runtime logs per request (TTFT, time per output token, drafted and accepted tokens),
published by :mod:`peagle_constructs.request_log_filters` into the monitoring's namespace. SageMaker's: the
invocation metrics (AWS/SageMaker) and instance utilisation, per variant, or per component (dimension
``InferenceComponentName``, utilisation normalised to what the component reserved).

Acceptance: per request the runtime logs drafted and accepted token counts, so the acceptance rate is accepted /
drafted, summed over the period (token-weighted), and the acceptance length AL = 1 + K * accepted / drafted,
which equals vLLM's 1 + accepted / drafts because every draft step proposes exactly K tokens.
"""

from __future__ import annotations

from typing import Any, Mapping

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch

from peagle_constructs.alarm_thresholds import AlarmThresholds
from peagle_constructs.metrics import InvocationMetrics, expression_options, metric
from peagle_constructs.request_log_filters import cloudwatch_unit, request_field
from peagle_constructs.sagemaker_names import (
    COMPONENT_METRICS_NAMESPACE, ENDPOINT_METRICS_NAMESPACE, INVOCATION_METRICS_NAMESPACE,
)


class ServingMetrics(InvocationMetrics):
    """``metric_*`` for what is watched; mixed into :class:`~peagle_constructs.monitoring.EndpointMonitoring`,
    which sets the attributes below. Every metric_* takes CDK's metric options (period, statistic, label, unit,
    color, ...); the period defaults to the alarms' own."""

    endpoint_name: str
    variant_name: str
    component_name: str | None  # None: the endpoint's variant is watched
    namespace: str  # where the request lines' metrics are published
    num_speculative_tokens: int  # K, for the acceptance length
    alarm_thresholds: AlarmThresholds

    # -- metrics from the request lines -------------------------------------------------------------
    def metric_request_field(self, metric_name: str, **options: Any) -> cloudwatch.Metric:
        """Any metric the request lines' filters publish (:mod:`peagle_constructs.request_log_filters`)."""
        field = request_field(metric_name)
        return metric(self.namespace, field.metric_name, {},
                      {"statistic": "Average", "unit": cloudwatch_unit(field), "period": self.alarm_thresholds.period},
                      options)

    def metric_ttft(self, **options: Any) -> cloudwatch.Metric:
        return self.metric_request_field("TimeToFirstToken", **{"statistic": "p90", **options})

    def metric_tpot(self, **options: Any) -> cloudwatch.Metric:
        return self.metric_request_field("TimePerOutputToken", **{"statistic": "p90", **options})

    def metric_end_to_end_latency(self, **options: Any) -> cloudwatch.Metric:
        return self.metric_request_field("EndToEndLatency", **{"statistic": "p90", **options})

    def _token_sums(self, period: Duration | None) -> dict[str, cloudwatch.Metric]:
        return {"accepted": self.metric_request_field("AcceptedTokens", statistic="Sum", period=period),
                "drafted": self.metric_request_field("DraftedTokens", statistic="Sum", period=period)}

    def metric_acceptance_rate(self, *, min_drafted: int = 1, **options: Any) -> cloudwatch.MathExpression:
        """Accepted per drafted token; 1 (nothing to judge) while fewer than ``min_drafted`` tokens were drafted."""
        given = expression_options(options, "the acceptance rate")
        period = given.pop("period", self.alarm_thresholds.period)
        return cloudwatch.MathExpression(
            expression=f"IF(drafted >= {min_drafted}, accepted / drafted, 1)",
            using_metrics=self._token_sums(period), period=period, **{"label": "Accepted per drafted token", **given})

    def metric_acceptance_length(self, **options: Any) -> cloudwatch.MathExpression:
        k = self.num_speculative_tokens
        given = expression_options(options, "the acceptance length")
        period = given.pop("period", self.alarm_thresholds.period)
        return cloudwatch.MathExpression(
            expression=f"IF(drafted > 0, 1 + {k} * accepted / drafted, 0)", using_metrics=self._token_sums(period),
            period=period, **{"label": f"Acceptance length (tokens per target step, K={k})", **given})

    # -- SageMaker's own metrics --------------------------------------------------------------------
    @property
    def _dimensions(self) -> dict[str, str]:
        if self.component_name:
            return {"InferenceComponentName": self.component_name}
        return {"EndpointName": self.endpoint_name, "VariantName": self.variant_name}

    def _sagemaker(self, metric_name: str, statistic: str, options: Mapping[str, Any],
                   namespace: str = INVOCATION_METRICS_NAMESPACE) -> cloudwatch.Metric:
        return metric(namespace, metric_name, self._dimensions,
                      {"statistic": statistic, "period": self.alarm_thresholds.period}, options)

    def _utilization(self, metric_name: str, options: Mapping[str, Any]) -> cloudwatch.Metric:
        """An instance metric of the endpoint, or the component's share of it (``<name>Normalized``)."""
        if self.component_name:
            return self._sagemaker(f"{metric_name}Normalized", "Average", options, namespace=COMPONENT_METRICS_NAMESPACE)
        return self._sagemaker(metric_name, "Average", options, namespace=ENDPOINT_METRICS_NAMESPACE)

    def _invocation_metric(self, metric_name: str, statistic: str, options: Mapping[str, Any]) -> cloudwatch.Metric:
        return self._sagemaker(metric_name, statistic, options)

    def metric_error_rate(self, error_metric: str, **options: Any) -> cloudwatch.MathExpression:
        """Percent of invocations counted by ``error_metric``; 0 in a period with fewer than ``min_requests``."""
        minimum = self.alarm_thresholds.min_requests
        given = expression_options(options, error_metric)
        period = given.pop("period", self.alarm_thresholds.period)
        return cloudwatch.MathExpression(
            expression=f"IF(requests >= {minimum}, 100 * errors / requests, 0)",
            using_metrics={"errors": self._sagemaker(error_metric, "Sum", {"period": period}),
                           "requests": self._sagemaker("Invocations", "Sum", {"period": period})},
            period=period, **{"label": f"{error_metric} (% of requests)", **given},
        )

    def metric_concurrent_requests(self, **options: Any) -> cloudwatch.Metric:
        """In-flight requests per model (a component: per copy)."""
        name = "ConcurrentRequestsPerCopy" if self.component_name else "ConcurrentRequestsPerModel"
        return self._sagemaker(name, "Maximum", options)

    def metric_gpu_utilization(self, **options: Any) -> cloudwatch.Metric:
        return self._utilization("GPUUtilization", options)

    def metric_gpu_memory_utilization(self, **options: Any) -> cloudwatch.Metric:
        return self._utilization("GPUMemoryUtilization", options)
