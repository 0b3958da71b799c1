"""The alarms of one endpoint variant or inference component: metric alarms, and PromQL alarms on vLLM's metrics.

Each alarm is made in the caller's scope under its own id (``TimePerOutputTokenP90``, ...), so the logical ids
stay the monitoring's, and is named ``<prefix><id>``. Whether a metric alarm rolls a deployment back is
:data:`peagle_constructs.rollback_signals.ROLLBACK_SIGNALS`'s to say; a PromQL alarm never does (SageMaker's
guardrails do not say they qualify). Whom they notify is the caller's (:mod:`peagle_constructs.monitoring`).
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from constructs import Construct

from peagle_constructs.alarm_thresholds import AlarmThresholds
from peagle_constructs.native_metrics import VllmMetricNames, acceptance_rate_query, quantile_query
from peagle_constructs.rollback_signals import ROLLBACK_SIGNALS
from peagle_constructs.serving_metrics import ServingMetrics

_Op = cloudwatch.ComparisonOperator


def metric_alarms(scope: Construct, *, metrics: ServingMetrics, thresholds: AlarmThresholds,
                  alarm_name_prefix: str) -> dict[str, cloudwatch.Alarm]:
    """The metric alarms: two that roll a deployment back (ROLLBACK_SIGNALS), the others page only; by id."""
    t = thresholds
    alarms: dict[str, cloudwatch.Alarm] = {}

    def alarm(id: str, metric: cloudwatch.IMetric, threshold: float, what: str, *,
              comparison: cloudwatch.ComparisonOperator = _Op.GREATER_THAN_THRESHOLD) -> None:
        rollback = id in ROLLBACK_SIGNALS
        percentile = isinstance(metric, cloudwatch.Metric) and str(metric.statistic).lower().startswith("p")
        alarms[id] = cloudwatch.Alarm(
            scope, id, metric=metric, threshold=threshold, alarm_name=f"{alarm_name_prefix}{id}",
            evaluation_periods=t.evaluation_periods, datapoints_to_alarm=t.datapoints_to_alarm,
            comparison_operator=comparison, treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            evaluate_low_sample_count_percentile="ignore" if percentile else None,
            alarm_description=f"{alarm_name_prefix.removesuffix('-')}: {what}."
                              + (" A deployment rolls back while it is in ALARM." if rollback else ""),
        )

    alarm("TimeToFirstTokenP90", metrics.metric_ttft(statistic="p90"), t.ttft_p90_ms,
          "TTFT p90 (ms) from the runtime's request lines is above the threshold; pages only "
          "(clients move it with prompt length and bursts)")
    alarm("TimePerOutputTokenP90", metrics.metric_tpot(statistic="p90"), t.tpot_p90_ms,
          "time per output token p90 (ms, the engine's decode time) from the request lines is above the threshold")
    alarm("Invocation5XXErrorRate", metrics.metric_error_rate("Invocation5XXErrors"), t.error_rate_percent,
          "the share of requests answered with a 5xx error is above the threshold",
          comparison=_Op.GREATER_THAN_OR_EQUAL_TO_THRESHOLD)
    alarm("InvocationModelErrorRate", metrics.metric_error_rate("InvocationModelErrors"), t.model_error_rate_percent,
          "the share of requests the container answered outside 2xx (4xx included) is above the threshold",
          comparison=_Op.GREATER_THAN_OR_EQUAL_TO_THRESHOLD)
    if t.acceptance_rate_min is not None:
        drafted = t.min_requests * metrics.num_speculative_tokens
        alarm("AcceptanceRate", metrics.metric_acceptance_rate(min_drafted=drafted), t.acceptance_rate_min,
              "the drafter's accepted share of draft tokens fell below the threshold (a drafter that no longer "
              "matches the target)", comparison=_Op.LESS_THAN_THRESHOLD)
    alarm("ModelLatencyP99", metrics.metric_model_latency(statistic="p99"),
          t.model_latency_p99_ms * 1000.0,  # ModelLatency is in microseconds
          "SageMaker ModelLatency p99 (whole requests) is above the threshold; notification only")
    return alarms


def promql_alarms(scope: Construct, names: VllmMetricNames, *, thresholds: AlarmThresholds, alarm_name_prefix: str,
                  endpoint_name: str, component_name: str | None) -> dict[str, cloudwatch.PromQLAlarm]:
    """PromQL alarms on vLLM's own histograms and counters (detailed observability); notification only; by id."""
    t = thresholds
    where = {"endpoint_name": endpoint_name, "component_name": component_name, "window": t.promql_window}
    queries = {
        "VllmTimeToFirstTokenP90": (
            f"{quantile_query(names.time_to_first_token, 0.9, **where)} > {t.ttft_p90_ms / 1000.0:g}",
            "vLLM's time to first token p90 (s) is above the threshold"),
        "VllmInterTokenLatencyP90": (
            f"{quantile_query(names.inter_token_latency, 0.9, **where)} > {t.tpot_p90_ms / 1000.0:g}",
            "vLLM's inter-token latency p90 (s) is above the threshold"),
    }
    if t.acceptance_rate_min is not None:
        queries["VllmAcceptanceRate"] = (
            f"{acceptance_rate_query(names, **where)} < {t.acceptance_rate_min:g}",
            "vLLM's spec-decode acceptance rate fell below the threshold")
    return {
        id: cloudwatch.PromQLAlarm(
            scope, id, query=query, alarm_name=f"{alarm_name_prefix}{id}",
            evaluation_interval=Duration.minutes(1), pending_period=t.period.plus(t.period),
            alarm_description=f"{alarm_name_prefix.removesuffix('-')}: {what} (PromQL on detailed "
                              "observability); notification only.",
        )
        for id, (query, what) in queries.items()
    }
