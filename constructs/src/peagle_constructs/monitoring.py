"""The endpoint's log group, request metrics from the runtime's JSON lines, alarms, notifications and dashboard.

Two metric paths. Ours works everywhere: metric filters generated from :mod:`peagle_contract.request_log`
(the schema the runtime writes), never from field names typed here. AWS's native one: SageMaker's detailed
observability publishes vLLM's own metrics, read by PromQL alarms (:mod:`peagle_constructs.native_metrics`).

Which alarms roll a deployment back. SageMaker's guardrails take "CloudWatch alarms ... configured to
monitor metrics on an endpoint" by name (AutoRollbackConfig, at most 10); they do not say PromQL alarms
qualify, so the rollback set is metric alarms only - and only on signals that a healthy fleet never trips and
that no client can move at will, since any client could otherwise roll back any deploy (:data:`ROLLBACK_SIGNALS`
says why each one qualifies, :data:`PAGE_ONLY_SIGNALS` why the others only page):

- the 5XX error rate: no client input answers 5xx (the image refuses it with a 4xx naming the field);
- time per output token, on the engine's clock (vLLM's decode time per token, not the pace a client reads at),
  against a threshold above the step time of plain decoding at the batch limit, so a client that defeats the
  drafter (``temperature: 2``, random prompts) slows its own tokens to at most that step time and no further.

Time to first token grows with the prompt a client sends and the queue a burst of clients makes; the model
error rate counts every non-2xx, 4xx included (botocore's ModelError: "returned 4xx or 5xx error code"); the
acceptance rate falls with sampling temperature and random prompts: each pages, none rolls back. The PromQL
alarms carry the same signals from vLLM's side and notify only. A deploy without any rollback (a hotfix during
an incident) is :mod:`peagle_constructs.break_glass`: the stack diff flags it.

Acceptance: per request the runtime logs drafted and accepted token counts, so the dashboard plots the
acceptance rate (accepted / drafted, summed over the period, so token-weighted) and the acceptance length
AL = 1 + K * accepted / drafted, which equals vLLM's 1 + accepted / drafts because every draft step
proposes exactly K tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from aws_cdk import Aws, Duration, RemovalPolicy
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

from peagle_contract import request_log
from peagle_contract.request_log import METRIC_FIELDS, MetricField
from peagle_contract.serving import check_num_speculative_tokens

from peagle_constructs.endpoint_reference import InvocationMetrics, expression_options, metric
from peagle_constructs.errors import ConfigError
from peagle_constructs.native_metrics import VllmMetricNames, acceptance_rate_query, quantile_query
from peagle_constructs.notifications import AlarmSubscriber, AlarmTopic
from peagle_constructs.sagemaker_names import (
    COMPONENT_METRICS_NAMESPACE, ENDPOINT_METRICS_NAMESPACE, INVOCATION_METRICS_NAMESPACE, container_log_group,
)
from peagle_constructs.security import limit_grants_to_aws_services
from peagle_constructs.validation import check_duration, check_int, check_number, check_positive

_FIELDS_BY_METRIC = {f.metric_name: f for f in METRIC_FIELDS}
# The metric alarms that roll a deployment back, and why no client can move them at will.
ROLLBACK_SIGNALS = {
    "Invocation5XXErrorRate": "no client input answers 5xx: the image refuses what it cannot serve with a 4xx "
                              "naming the field, and a drain refuses new requests only on an instance SageMaker is "
                              "already taking out of service",
    "TimePerOutputTokenP90": "the engine's own decode time per token (vLLM's per-request metrics), which a slow "
                             "reader cannot stretch; its threshold sits above plain decoding's step time at the "
                             "batch limit, so a client that defeats the drafter cannot reach it",
}
# The metric alarms that page without rolling back, and the client's lever on each.
PAGE_ONLY_SIGNALS = {
    "TimeToFirstTokenP90": "grows with the prompt a client sends (prefill) and with the queue a burst makes",
    "InvocationModelErrorRate": "counts every non-2xx answer, 4xx included: any client sending bad requests "
                                "moves it",
    "AcceptanceRate": "falls with sampling temperature and with prompts unlike the drafter's training data: a "
                      "client at temperature 2 drives it down at will",
    "ModelLatencyP99": "grows with the tokens a client asks for",
}


@dataclass(frozen=True, kw_only=True)
class AlarmThresholds:
    """When the alarms fire. Latencies in milliseconds, rates in percent of requests (or of draft tokens).

    Whole-request latency (SageMaker's ModelLatency) is not a rollback signal: it grows with the tokens a
    client asks for, and a healthy 16K-token whole-body answer takes minutes. It notifies only, by default at
    60 s p99 - SageMaker's limit for an InvokeEndpoint answer, past which clients get errors anyway.
    """

    ttft_p90_ms: float = 2000.0
    # Above plain decoding's step time at max_num_seqs and max_model_len (what a request gets when the drafter's
    # guesses are all refused), so that no client can reach it by defeating the drafter; it rolls back.
    tpot_p90_ms: float = 100.0
    error_rate_percent: float = 5.0  # Invocation5XXErrors per invocation
    model_error_rate_percent: float = 5.0  # InvocationModelErrors per invocation
    acceptance_rate_min: float | None = 0.1  # accepted per drafted token; None: no acceptance alarm
    model_latency_p99_ms: float = 60_000.0  # notification only
    # Below this many requests in a period, rates and acceptance never alarm (one failed request in two is not
    # a fleet-wide 50% error rate); percentiles use CloudWatch's own low-sample rule (too few: not evaluated).
    min_requests: int = 10
    period: Duration = Duration.minutes(1)
    evaluation_periods: int = 3
    datapoints_to_alarm: int = 2
    promql_window: Duration = Duration.minutes(5)

    def validate(self) -> None:
        for name in ("ttft_p90_ms", "tpot_p90_ms", "model_latency_p99_ms"):
            check_positive(getattr(self, name), f"alarm_thresholds.{name}", "a positive number of milliseconds")
        for name in ("error_rate_percent", "model_error_rate_percent"):
            check_number(getattr(self, name), f"alarm_thresholds.{name}", low=0, low_open=True, high=100,
                         allowed="a percentage in (0, 100]")
        if self.acceptance_rate_min is not None:
            check_number(self.acceptance_rate_min, "alarm_thresholds.acceptance_rate_min", low=0, high=1, low_open=True,
                         high_open=True, allowed="a fraction in (0, 1), or None")
        check_int(self.min_requests, "alarm_thresholds.min_requests", 1)
        period = check_duration(self.period, "alarm_thresholds.period", 10, 86400)
        if period not in (10, 30) and period % 60:
            raise ConfigError("alarm_thresholds.period", f"got {period} s; allowed: 10, 30 or a multiple of 60 s")
        check_int(self.evaluation_periods, "alarm_thresholds.evaluation_periods", 1)
        check_int(self.datapoints_to_alarm, "alarm_thresholds.datapoints_to_alarm", 1, self.evaluation_periods,
                  allowed=f"1..evaluation_periods ({self.evaluation_periods})")
        check_duration(self.promql_window, "alarm_thresholds.promql_window", 60, 3600)


class EndpointMonitoring(InvocationMetrics, Construct):
    """Observability for one endpoint variant - or, with ``component_name``, one inference component on it.

    Creates the log group SageMaker writes container output to (``/aws/sagemaker/Endpoints/<name>``, for a
    component ``/aws/sagemaker/InferenceComponents/<component>``) with retention and KMS, so its lifetime and
    encryption are ours rather than the service's defaults. Every alarm is named ``<endpoint or component
    name>-<what>`` and notifies ``subscribers`` through :class:`AlarmTopic`. SageMaker's metrics are read
    per variant, or per component (dimension ``InferenceComponentName``, utilisation normalised to what
    the component reserved). ``native_alarms`` adds the PromQL alarms on vLLM's metrics (they need detailed
    observability on; they select the endpoint's series by its label, a component's by its own too).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        endpoint_name: str,
        variant_name: str,
        num_speculative_tokens: int,
        encryption_key: kms.IKey | None = None,
        log_retention: logs.RetentionDays = logs.RetentionDays.ONE_YEAR,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
        alarm_thresholds: AlarmThresholds = AlarmThresholds(),
        namespace: str | None = None,
        alarm_subscribers: Sequence[AlarmSubscriber] = (),
        native_alarms: bool = True,
        vllm_metrics: VllmMetricNames = VllmMetricNames(),
        component_name: str | None = None,
    ) -> None:
        super().__init__(scope, id)
        check_num_speculative_tokens(num_speculative_tokens, "monitoring.num_speculative_tokens")
        alarm_thresholds.validate()
        self.endpoint_name, self.variant_name = endpoint_name, variant_name
        self.component_name = component_name
        # What is watched: its name keys the log group, the alarms and the request-line namespace.
        watched = component_name or endpoint_name
        what = f"inference component {component_name}" if component_name else f"SageMaker endpoint {endpoint_name}"
        self._dimensions = ({"InferenceComponentName": component_name} if component_name
                            else {"EndpointName": endpoint_name, "VariantName": variant_name})
        self.num_speculative_tokens = num_speculative_tokens
        self.alarm_thresholds = alarm_thresholds
        self.namespace = namespace or f"{request_log.DEFAULT_NAMESPACE}/{watched}"
        self.alarm_name_prefix = f"{watched}-"
        self.key = encryption_key or limit_grants_to_aws_services(kms.Key(
            self, "Key", enable_key_rotation=True, removal_policy=removal_policy,
            description=f"Encrypts the logs and alarm topic of {what}",
        ))

        log_group_name = container_log_group(endpoint_name, component_name)
        self.log_group = encrypted_log_group(self, "LogGroup", log_group_name, key=self.key, retention=log_retention,
                                             removal_policy=removal_policy)
        self.metric_filters = self._metric_filters()
        self.notifications = AlarmTopic(self, "AlarmTopic", key=self.key, alarm_name_prefix=self.alarm_name_prefix,
                                        subscribers=alarm_subscribers, display_name=f"Alarms of {what}")
        self.topic = self.notifications.topic
        self.alarms: dict[str, cloudwatch.IAlarm] = {}
        self._rollback: list[cloudwatch.IAlarm] = []
        self._request_alarms()
        if native_alarms:
            self._native_alarms(vllm_metrics)
        self.dashboard = self._dashboard()

    def _metric_filters(self) -> dict[str, logs.MetricFilter]:
        """One metric filter per field of the runtime's request line (:mod:`peagle_contract.request_log`)."""
        return {
            field.metric_name: logs.MetricFilter(
                self, f"{field.metric_name}Filter",
                log_group=self.log_group,
                filter_pattern=logs.FilterPattern.literal(request_log.filter_pattern(field)),
                metric_namespace=self.namespace,
                metric_name=field.metric_name,
                metric_value=request_log.metric_value(field),
                unit=_unit(field),
            )
            for field in METRIC_FIELDS
        }

    # -- alarms -------------------------------------------------------------------------------------
    def _request_alarms(self) -> None:
        """The metric alarms: two that roll a deployment back (:data:`ROLLBACK_SIGNALS`), the others page only."""
        t = self.alarm_thresholds
        op = cloudwatch.ComparisonOperator
        self._metric_alarm("TimeToFirstTokenP90", self.metric_ttft(statistic="p90"), t.ttft_p90_ms,
                           "TTFT p90 (ms) from the runtime's request lines is above the threshold; pages only "
                           "(clients move it with prompt length and bursts)")
        self._metric_alarm("TimePerOutputTokenP90", self.metric_tpot(statistic="p90"), t.tpot_p90_ms,
                           "time per output token p90 (ms, the engine's decode time) from the request lines is above "
                           "the threshold")
        self._metric_alarm("Invocation5XXErrorRate", self.metric_error_rate("Invocation5XXErrors"),
                           t.error_rate_percent, "the share of requests answered with a 5xx error is above the threshold",
                           comparison=op.GREATER_THAN_OR_EQUAL_TO_THRESHOLD)
        self._metric_alarm("InvocationModelErrorRate", self.metric_error_rate("InvocationModelErrors"),
                           t.model_error_rate_percent, "the share of requests the container answered outside 2xx (4xx "
                           "included) is above the threshold", comparison=op.GREATER_THAN_OR_EQUAL_TO_THRESHOLD)
        if t.acceptance_rate_min is not None:
            drafted = t.min_requests * self.num_speculative_tokens
            self._metric_alarm("AcceptanceRate", self.metric_acceptance_rate(min_drafted=drafted),
                               t.acceptance_rate_min, "the drafter's accepted share of draft tokens fell below the "
                               "threshold (a drafter that no longer matches the target)",
                               comparison=op.LESS_THAN_THRESHOLD)
        self._metric_alarm("ModelLatencyP99", self.metric_model_latency(statistic="p99"),
                           t.model_latency_p99_ms * 1000.0,  # ModelLatency is in microseconds
                           "SageMaker ModelLatency p99 (whole requests) is above the threshold; notification only")

    def _notify(self, id: str, alarm: cloudwatch.IAlarm, *, rollback: bool) -> None:
        for target in self.notifications.targets:
            action = cloudwatch_actions.SnsAction(target)
            alarm.add_alarm_action(action)
            alarm.add_ok_action(action)
        self.alarms[id] = alarm
        if rollback:
            self._rollback.append(alarm)

    def _metric_alarm(self, id: str, metric: cloudwatch.IMetric, threshold: float, what: str, *,
                      comparison: cloudwatch.ComparisonOperator = cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD
                      ) -> None:
        t = self.alarm_thresholds
        rollback = id in ROLLBACK_SIGNALS
        percentile = isinstance(metric, cloudwatch.Metric) and str(metric.statistic).lower().startswith("p")
        alarm = cloudwatch.Alarm(
            self, id, metric=metric, threshold=threshold, alarm_name=f"{self.alarm_name_prefix}{id}",
            evaluation_periods=t.evaluation_periods, datapoints_to_alarm=t.datapoints_to_alarm,
            comparison_operator=comparison, treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            evaluate_low_sample_count_percentile="ignore" if percentile else None,
            alarm_description=f"{self.alarm_name_prefix.removesuffix('-')}: {what}."
                              + (" A deployment rolls back while it is in ALARM." if rollback else ""),
        )
        self._notify(id, alarm, rollback=rollback)

    def _native_alarms(self, names: VllmMetricNames) -> None:
        """PromQL alarms on vLLM's own histograms and counters (detailed observability); notification only."""
        t = self.alarm_thresholds
        window = t.promql_window
        where = {"endpoint_name": self.endpoint_name, "component_name": self.component_name, "window": window}
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
        for id, (query, what) in queries.items():
            alarm = cloudwatch.PromQLAlarm(
                self, id, query=query, alarm_name=f"{self.alarm_name_prefix}{id}",
                evaluation_interval=Duration.minutes(1), pending_period=t.period.plus(t.period),
                alarm_description=f"{self.alarm_name_prefix.removesuffix('-')}: {what} (PromQL on detailed "
                                  "observability); notification only.",
            )
            self._notify(id, alarm, rollback=False)

    @property
    def rollback_alarms(self) -> tuple[cloudwatch.IAlarm, ...]:
        """The alarms a deployment rolls back on (metric alarms on signals a healthy fleet never trips)."""
        return tuple(self._rollback)

    @property
    def notification_alarms(self) -> tuple[cloudwatch.IAlarm, ...]:
        return tuple(a for a in self.alarms.values() if a not in self._rollback)

    # -- metrics from the request lines -------------------------------------------------------------
    # Every metric_* takes CDK's metric options (period, statistic, label, unit, color, ...); the period
    # defaults to the alarms' own.
    def metric_request_field(self, metric_name: str, **options: Any) -> cloudwatch.Metric:
        field = _FIELDS_BY_METRIC.get(metric_name)
        if field is None:
            raise ConfigError("metric_name", f"got {metric_name!r}; allowed: one of {sorted(_FIELDS_BY_METRIC)}")
        return metric(self.namespace, field.metric_name, {},
                      {"statistic": "Average", "unit": _unit(field), "period": self.alarm_thresholds.period}, options)

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

    # -- dashboard ----------------------------------------------------------------------------------
    def _dashboard(self) -> cloudwatch.Dashboard:
        def percentiles(fn, title: str) -> cloudwatch.GraphWidget:  # noqa: ANN001
            return cloudwatch.GraphWidget(title=title, width=8, left=[fn(statistic=s).with_(label=s) for s in ("p50", "p90", "p99")])

        dashboard = cloudwatch.Dashboard(self, "Dashboard", default_interval=Duration.hours(3))
        dashboard.add_widgets(
            percentiles(self.metric_ttft, "Time to first token (ms)"),
            percentiles(self.metric_tpot, "Time per output token (ms)"),
            percentiles(self.metric_end_to_end_latency, "End-to-end latency (ms)"),
        )
        dashboard.add_widgets(
            cloudwatch.GraphWidget(title="Acceptance length (1 + K x accepted/drafted)", width=8,
                                   left=[self.metric_acceptance_length()]),
            cloudwatch.GraphWidget(title="Acceptance rate (accepted / drafted tokens)", width=8,
                                   left=[self.metric_acceptance_rate()]),
            cloudwatch.GraphWidget(title="Invocations and concurrent requests", width=8,
                                   left=[self.metric_invocations()], right=[self.metric_concurrent_requests()]),
        )
        dashboard.add_widgets(
            cloudwatch.GraphWidget(title="Errors", width=8, left=[
                self.metric_invocation_5xx_errors(), self.metric_invocation_4xx_errors(),
                self.metric_invocation_model_errors()]),
            cloudwatch.GraphWidget(title="GPU utilisation and memory (%)", width=8, left=[
                self.metric_gpu_utilization(), self.metric_gpu_memory_utilization()]),
            cloudwatch.GraphWidget(title="Model latency p99 (us)", width=8, left=[self.metric_model_latency()]),
        )
        dashboard.add_widgets(
            cloudwatch.AlarmStatusWidget(title="Rollback alarms (metric alarms the deployment guardrail watches)",
                                         width=12, alarms=list(self.rollback_alarms)),
            cloudwatch.AlarmStatusWidget(title="Notification alarms (whole-request latency; vLLM's metrics by PromQL)",
                                         width=12, alarms=list(self.notification_alarms)),
        )
        dashboard.add_widgets(cloudwatch.TextWidget(width=24, height=2, markdown=(
            f"**vLLM's own metrics** (TTFT, inter-token latency, KV cache, queue, spec decode) for `{self.endpoint_name}`: "
            f"[CloudWatch > Insights > SageMaker AI](https://console.aws.amazon.com/cloudwatch/home?region={Aws.REGION}"
            f"#sagemaker-ai-insights), filtered by endpoint; the graphs above are the runtime's request lines.")))
        return dashboard


def encrypted_log_group(scope: Construct, id: str, name: str, *, key: kms.IKey, retention: logs.RetentionDays,
                        removal_policy: RemovalPolicy) -> logs.LogGroup:
    """The log group ``name``, encrypted with ``key``; the key lets CloudWatch Logs use it for this group only
    (Logs encrypts with a key only if the key policy lets the regional service use it)."""
    arn = f"arn:{Aws.PARTITION}:logs:{Aws.REGION}:{Aws.ACCOUNT_ID}:log-group:{name}"
    key.add_to_resource_policy(iam.PolicyStatement(
        principals=[iam.ServicePrincipal(f"logs.{Aws.REGION}.amazonaws.com")],
        actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
        resources=["*"],
        conditions={"ArnEquals": {"kms:EncryptionContext:aws:logs:arn": arn}},
    ))
    return logs.LogGroup(scope, id, log_group_name=name, retention=retention, encryption_key=key,
                         removal_policy=removal_policy)


def _unit(field: MetricField) -> cloudwatch.Unit:
    try:
        return cloudwatch.Unit[field.unit.upper()]
    except KeyError:
        raise ConfigError(f"request_log.{field.key}.unit", f"got {field.unit!r}; allowed: a CloudWatch unit") from None
