"""The dashboard of one endpoint variant or inference component: TTFT/TPOT percentiles, acceptance, traffic,
errors, GPU use and the state of its alarms."""

from __future__ import annotations

from typing import Callable, Sequence

from aws_cdk import Aws, Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from constructs import Construct

from peagle_constructs.serving_metrics import ServingMetrics


def _percentiles(metric: Callable[..., cloudwatch.Metric], title: str) -> cloudwatch.GraphWidget:
    return cloudwatch.GraphWidget(title=title, width=8,
                                  left=[metric(statistic=s).with_(label=s) for s in ("p50", "p90", "p99")])


def serving_dashboard(scope: Construct, *, metrics: ServingMetrics, rollback_alarms: Sequence[cloudwatch.IAlarm],
                      notification_alarms: Sequence[cloudwatch.IAlarm]) -> cloudwatch.Dashboard:
    """The dashboard, in ``scope`` (id ``Dashboard``), graphing ``metrics`` and showing the alarms' states."""
    dashboard = cloudwatch.Dashboard(scope, "Dashboard", default_interval=Duration.hours(3))
    dashboard.add_widgets(
        _percentiles(metrics.metric_ttft, "Time to first token (ms)"),
        _percentiles(metrics.metric_tpot, "Time per output token (ms)"),
        _percentiles(metrics.metric_end_to_end_latency, "End-to-end latency (ms)"),
    )
    dashboard.add_widgets(
        cloudwatch.GraphWidget(title="Acceptance length (1 + K x accepted/drafted)", width=8,
                               left=[metrics.metric_acceptance_length()]),
        cloudwatch.GraphWidget(title="Acceptance rate (accepted / drafted tokens)", width=8,
                               left=[metrics.metric_acceptance_rate()]),
        cloudwatch.GraphWidget(title="Invocations and concurrent requests", width=8,
                               left=[metrics.metric_invocations()], right=[metrics.metric_concurrent_requests()]),
    )
    dashboard.add_widgets(
        cloudwatch.GraphWidget(title="Errors", width=8, left=[
            metrics.metric_invocation_5xx_errors(), metrics.metric_invocation_4xx_errors(),
            metrics.metric_invocation_model_errors()]),
        cloudwatch.GraphWidget(title="GPU utilisation and memory (%)", width=8, left=[
            metrics.metric_gpu_utilization(), metrics.metric_gpu_memory_utilization()]),
        cloudwatch.GraphWidget(title="Model latency p99 (us)", width=8, left=[metrics.metric_model_latency()]),
    )
    dashboard.add_widgets(
        cloudwatch.AlarmStatusWidget(title="Rollback alarms (metric alarms the deployment guardrail watches)",
                                     width=12, alarms=list(rollback_alarms)),
        cloudwatch.AlarmStatusWidget(title="Notification alarms (whole-request latency; vLLM's metrics by PromQL)",
                                     width=12, alarms=list(notification_alarms)),
    )
    dashboard.add_widgets(cloudwatch.TextWidget(width=24, height=2, markdown=(
        f"**vLLM's own metrics** (TTFT, inter-token latency, KV cache, queue, spec decode) for "
        f"`{metrics.endpoint_name}`: [CloudWatch > Insights > SageMaker AI](https://console.aws.amazon.com/cloudwatch/"
        f"home?region={Aws.REGION}#sagemaker-ai-insights), filtered by endpoint; the graphs above are the runtime's "
        "request lines.")))
    return dashboard
