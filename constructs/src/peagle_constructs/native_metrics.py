"""AWS's native metrics path: SageMaker's detailed observability and PromQL over vLLM's own metrics.

With ``MetricsConfig.EnableDetailedObservability`` on the endpoint config, SageMaker runs an OpenTelemetry
collector beside the container that scrapes vLLM's Prometheus ``/metrics`` on port 8080 and publishes the
metrics to CloudWatch, labelled by endpoint (``aws.sagemaker.endpoint.name``), queryable with PromQL and
shown in CloudWatch's SageMaker AI Insights dashboard. A CloudWatch PromQL alarm is in ALARM while its query
returns any series for longer than its pending period, so each query below carries its own threshold.

The metric names are vLLM's own (checked against a real vLLM server's /metrics in the tests). How the
collector names them in CloudWatch could not be checked offline: AWS's pages give the labels but no vLLM
query; if your account shows other names, pass them through :class:`VllmMetricNames`.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration
from aws_cdk import aws_sagemaker as sagemaker

from peagle_constructs.errors import ConfigError

# MetricsConfig.MetricPublishFrequencyInSeconds (SageMaker API reference).
PUBLISH_FREQUENCIES_S = (10, 30, 60, 120, 180, 240, 300)
ENDPOINT_LABEL = "aws.sagemaker.endpoint.name"
# The collector labels an inference component's series with its name too (SageMaker's OpenTelemetry metrics
# reference, "OpenTelemetry metric labels").
COMPONENT_LABEL = "aws.sagemaker.inference_component.name"


@dataclass(frozen=True, kw_only=True)
class DetailedObservability:
    """SageMaker's detailed observability for the endpoint config: on by default, set explicitly.

    (It defaults to on only for endpoint configs created after 2026-06-17 and off for older ones; an explicit
    setting makes every config say what it does.)
    """

    enabled: bool = True
    publish_frequency: Duration = Duration.seconds(60)

    def validate(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ConfigError("detailed_observability.enabled", f"got {self.enabled!r}; allowed: True or False")
        seconds = self.publish_frequency.to_seconds() if isinstance(self.publish_frequency, Duration) else None
        if seconds not in PUBLISH_FREQUENCIES_S:
            raise ConfigError("detailed_observability.publish_frequency",
                              f"got {seconds if seconds is not None else self.publish_frequency!r} s; "
                              f"allowed: one of {PUBLISH_FREQUENCIES_S} s")

    def render(self) -> sagemaker.CfnEndpointConfig.MetricsConfigProperty:
        self.validate()
        return sagemaker.CfnEndpointConfig.MetricsConfigProperty(
            enable_detailed_observability=self.enabled,
            metric_publish_frequency_in_seconds=int(self.publish_frequency.to_seconds()) if self.enabled else None,
        )


@dataclass(frozen=True, kw_only=True)
class VllmMetricNames:
    """The vLLM metric families the PromQL alarms read (histograms and counters, as vLLM exposes them)."""

    time_to_first_token: str = "vllm:time_to_first_token_seconds"
    inter_token_latency: str = "vllm:inter_token_latency_seconds"
    accepted_tokens: str = "vllm:spec_decode_num_accepted_tokens"
    draft_tokens: str = "vllm:spec_decode_num_draft_tokens"


def _selector(metric: str, endpoint_name: str, component_name: str | None) -> str:
    # Label names with dots are quoted (PromQL's UTF-8 label syntax, as CloudWatch documents for OTel labels).
    labels = {ENDPOINT_LABEL: endpoint_name, **({COMPONENT_LABEL: component_name} if component_name else {})}
    return metric + "{" + ",".join(f'"{name}"="{value}"' for name, value in labels.items()) + "}"


def _window(window: Duration) -> str:
    return f"{int(window.to_seconds())}s"


def quantile_query(histogram: str, quantile: float, *, endpoint_name: str, window: Duration,
                   component_name: str | None = None) -> str:
    """The ``quantile`` of a vLLM histogram (seconds) over ``window``, across the endpoint's instances (or the
    component's copies)."""
    buckets = _selector(f"{histogram}_bucket", endpoint_name, component_name)
    return f"histogram_quantile({quantile}, sum by (le) (rate({buckets}[{_window(window)}])))"


def acceptance_rate_query(names: VllmMetricNames, *, endpoint_name: str, window: Duration,
                          component_name: str | None = None) -> str:
    """Accepted per drafted token over ``window`` (vLLM counters, ``_total`` in the exposition)."""
    accepted = _selector(f"{names.accepted_tokens}_total", endpoint_name, component_name)
    drafted = _selector(f"{names.draft_tokens}_total", endpoint_name, component_name)
    return f"sum(rate({accepted}[{_window(window)}])) / sum(rate({drafted}[{_window(window)}]))"
