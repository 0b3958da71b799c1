"""The endpoint's log group, request metrics from the runtime's JSON lines, alarms, topic and dashboard.

Metric filters come from :mod:`peagle_contract.request_log` (the schema the runtime writes), never from
field names typed here. Acceptance: per request the runtime logs drafted and accepted token counts, so
the dashboard plots the acceptance rate (accepted / drafted, summed over the period, so token-weighted)
and the acceptance length AL = 1 + K * accepted / drafted, which equals vLLM's 1 + accepted / drafts
because every draft step proposes exactly K tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Aws, Duration, RemovalPolicy
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from constructs import Construct

from peagle_contract import request_log
from peagle_contract.request_log import METRIC_FIELDS, MetricField
from peagle_contract.serving import check_num_speculative_tokens

from peagle_constructs.errors import ConfigError
from peagle_constructs.sagemaker_names import (
    ENDPOINT_LOG_GROUP_PREFIX, ENDPOINT_METRICS_NAMESPACE, INVOCATION_METRICS_NAMESPACE,
)
_FIELDS_BY_METRIC = {f.metric_name: f for f in METRIC_FIELDS}


@dataclass(frozen=True, kw_only=True)
class AlarmThresholds:
    """When the rollback alarms fire. Latency thresholds in milliseconds, errors per ``period``."""

    ttft_p90_ms: float = 2000.0
    model_latency_p99_ms: float = 120_000.0
    invocation_5xx_errors: int = 5
    model_errors: int = 5
    period: Duration = Duration.minutes(1)
    evaluation_periods: int = 3
    datapoints_to_alarm: int = 2

    def validate(self) -> None:
        for name in ("ttft_p90_ms", "model_latency_p99_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"monitoring.{name}", f"got {value!r}; allowed: a positive number of milliseconds")
        for name in ("invocation_5xx_errors", "model_errors"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"monitoring.{name}", f"got {value!r}; allowed: an integer >= 1")
        if self.period.to_seconds() not in (10, 30) and self.period.to_seconds() % 60:
            raise ConfigError("monitoring.period", f"got {self.period.to_seconds()} s; allowed: 10, 30 or a multiple of 60 s")
        if not 1 <= self.datapoints_to_alarm <= self.evaluation_periods:
            raise ConfigError("monitoring.datapoints_to_alarm",
                              f"got {self.datapoints_to_alarm}; allowed: 1..evaluation_periods ({self.evaluation_periods})")


class EndpointMonitoring(Construct):
    """Observability for one endpoint variant, keyed by the endpoint's (known) name.

    Creates the log group SageMaker writes container output to (``/aws/sagemaker/Endpoints/<name>``) with
    retention and KMS, so its lifetime and encryption are ours rather than the service's defaults.
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
        thresholds: AlarmThresholds = AlarmThresholds(),
        namespace: str | None = None,
        topic: sns.ITopic | None = None,
    ) -> None:
        super().__init__(scope, id)
        check_num_speculative_tokens(num_speculative_tokens, "monitoring.num_speculative_tokens")
        thresholds.validate()
        self.endpoint_name, self.variant_name = endpoint_name, variant_name
        self.num_speculative_tokens = num_speculative_tokens
        self.thresholds = thresholds
        self.namespace = namespace or f"{request_log.DEFAULT_NAMESPACE}/{endpoint_name}"
        self.key = encryption_key or kms.Key(
            self, "Key", enable_key_rotation=True, removal_policy=removal_policy,
            description=f"Encrypts the logs and alarm topic of SageMaker endpoint {endpoint_name}",
        )

        log_group_name = f"{ENDPOINT_LOG_GROUP_PREFIX}{endpoint_name}"
        log_group_arn = f"arn:{Aws.PARTITION}:logs:{Aws.REGION}:{Aws.ACCOUNT_ID}:log-group:{log_group_name}"
        # CloudWatch Logs encrypts with the key only if the key policy lets the regional service use it.
        self.key.add_to_resource_policy(iam.PolicyStatement(
            principals=[iam.ServicePrincipal(f"logs.{Aws.REGION}.amazonaws.com")],
            actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
            resources=["*"],
            conditions={"ArnEquals": {"kms:EncryptionContext:aws:logs:arn": log_group_arn}},
        ))
        self.log_group = logs.LogGroup(
            self, "LogGroup", log_group_name=log_group_name, retention=log_retention,
            encryption_key=self.key, removal_policy=removal_policy,
        )
        self.metric_filters: dict[str, logs.MetricFilter] = {
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

        if topic is None:
            # Alarms publish through the key: CloudWatch needs to use it, and only over TLS.
            self.key.add_to_resource_policy(iam.PolicyStatement(
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"], resources=["*"],
            ))
            topic = sns.Topic(self, "AlarmTopic", master_key=self.key, enforce_ssl=True,
                              display_name=f"Alarms of SageMaker endpoint {endpoint_name}")
        self.topic = topic

        self.alarms: dict[str, cloudwatch.Alarm] = {}
        self._alarm("TimeToFirstTokenP90", self.metric_ttft(statistic="p90"), thresholds.ttft_p90_ms,
                    "TTFT p90 (ms) from the runtime's request lines is above the threshold")
        self._alarm("ModelLatencyP99", self.metric_model_latency(statistic="p99"),
                    thresholds.model_latency_p99_ms * 1000.0,  # ModelLatency is in microseconds
                    "SageMaker ModelLatency p99 is above the threshold")
        self._alarm("Invocation5XXErrors", self.metric_invocation_5xx_errors(), thresholds.invocation_5xx_errors,
                    "the endpoint answers with 5xx errors", at_least=True)
        self._alarm("InvocationModelErrors", self.metric_invocation_model_errors(), thresholds.model_errors,
                    "the model container answers with errors", at_least=True)
        self.dashboard = self._dashboard()

    # -- alarms -------------------------------------------------------------------------------------
    def _alarm(self, id: str, metric: cloudwatch.IMetric, threshold: float, what: str, *, at_least: bool = False) -> None:
        t = self.thresholds
        op = cloudwatch.ComparisonOperator
        comparison = op.GREATER_THAN_OR_EQUAL_TO_THRESHOLD if at_least else op.GREATER_THAN_THRESHOLD
        alarm = cloudwatch.Alarm(
            self, id, metric=metric, threshold=threshold,
            evaluation_periods=t.evaluation_periods, datapoints_to_alarm=t.datapoints_to_alarm,
            comparison_operator=comparison,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=f"{self.endpoint_name}: {what}. A blue/green deployment rolls back while it is in ALARM.",
        )
        action = cloudwatch_actions.SnsAction(self.topic)
        alarm.add_alarm_action(action)
        alarm.add_ok_action(action)
        self.alarms[id] = alarm

    @property
    def rollback_alarms(self) -> tuple[cloudwatch.Alarm, ...]:
        return tuple(self.alarms.values())

    # -- metrics from the request lines -------------------------------------------------------------
    def metric_request_field(self, metric_name: str, *, statistic: str = "Average",
                             period: Duration | None = None) -> cloudwatch.Metric:
        field = _FIELDS_BY_METRIC.get(metric_name)
        if field is None:
            raise ConfigError("metric_name", f"got {metric_name!r}; allowed: one of {sorted(_FIELDS_BY_METRIC)}")
        return cloudwatch.Metric(namespace=self.namespace, metric_name=field.metric_name, statistic=statistic,
                                 unit=_unit(field), period=period or self.thresholds.period)

    def metric_ttft(self, *, statistic: str = "p90", period: Duration | None = None) -> cloudwatch.Metric:
        return self.metric_request_field("TimeToFirstToken", statistic=statistic, period=period)

    def metric_tpot(self, *, statistic: str = "p90", period: Duration | None = None) -> cloudwatch.Metric:
        return self.metric_request_field("TimePerOutputToken", statistic=statistic, period=period)

    def metric_end_to_end_latency(self, *, statistic: str = "p90", period: Duration | None = None) -> cloudwatch.Metric:
        return self.metric_request_field("EndToEndLatency", statistic=statistic, period=period)

    def metric_acceptance_rate(self, *, period: Duration | None = None) -> cloudwatch.MathExpression:
        return cloudwatch.MathExpression(
            expression="IF(drafted > 0, accepted / drafted, 0)", label="Accepted per drafted token",
            using_metrics={"accepted": self.metric_request_field("AcceptedTokens", statistic="Sum", period=period),
                           "drafted": self.metric_request_field("DraftedTokens", statistic="Sum", period=period)},
            period=period or self.thresholds.period,
        )

    def metric_acceptance_length(self, *, period: Duration | None = None) -> cloudwatch.MathExpression:
        k = self.num_speculative_tokens
        return cloudwatch.MathExpression(
            expression=f"IF(drafted > 0, 1 + {k} * accepted / drafted, 0)",
            label=f"Acceptance length (tokens per target step, K={k})",
            using_metrics={"accepted": self.metric_request_field("AcceptedTokens", statistic="Sum", period=period),
                           "drafted": self.metric_request_field("DraftedTokens", statistic="Sum", period=period)},
            period=period or self.thresholds.period,
        )

    # -- SageMaker's own metrics --------------------------------------------------------------------
    def _sagemaker(self, metric_name: str, statistic: str, period: Duration | None,
                   namespace: str = INVOCATION_METRICS_NAMESPACE) -> cloudwatch.Metric:
        return cloudwatch.Metric(
            namespace=namespace, metric_name=metric_name, statistic=statistic,
            dimensions_map={"EndpointName": self.endpoint_name, "VariantName": self.variant_name},
            period=period or self.thresholds.period,
        )

    def metric_model_latency(self, *, statistic: str = "p99", period: Duration | None = None) -> cloudwatch.Metric:
        """Microseconds, as SageMaker reports it."""
        return self._sagemaker("ModelLatency", statistic, period)

    def metric_invocations(self, *, statistic: str = "Sum", period: Duration | None = None) -> cloudwatch.Metric:
        return self._sagemaker("Invocations", statistic, period)

    def metric_invocation_5xx_errors(self, *, statistic: str = "Sum", period: Duration | None = None) -> cloudwatch.Metric:
        return self._sagemaker("Invocation5XXErrors", statistic, period)

    def metric_invocation_4xx_errors(self, *, statistic: str = "Sum", period: Duration | None = None) -> cloudwatch.Metric:
        return self._sagemaker("Invocation4XXErrors", statistic, period)

    def metric_invocation_model_errors(self, *, statistic: str = "Sum", period: Duration | None = None) -> cloudwatch.Metric:
        return self._sagemaker("InvocationModelErrors", statistic, period)

    def metric_concurrent_requests(self, *, statistic: str = "Maximum", period: Duration | None = None) -> cloudwatch.Metric:
        return self._sagemaker("ConcurrentRequestsPerModel", statistic, period)

    def metric_gpu_utilization(self, *, statistic: str = "Average", period: Duration | None = None) -> cloudwatch.Metric:
        return self._sagemaker("GPUUtilization", statistic, period, namespace=ENDPOINT_METRICS_NAMESPACE)

    def metric_gpu_memory_utilization(self, *, statistic: str = "Average", period: Duration | None = None) -> cloudwatch.Metric:
        return self._sagemaker("GPUMemoryUtilization", statistic, period, namespace=ENDPOINT_METRICS_NAMESPACE)

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
        dashboard.add_widgets(cloudwatch.AlarmStatusWidget(title="Rollback alarms", width=24, alarms=list(self.alarms.values())))
        return dashboard


def _unit(field: MetricField) -> cloudwatch.Unit:
    try:
        return cloudwatch.Unit[field.unit.upper()]
    except KeyError:
        raise ConfigError(f"request_log.{field.key}.unit", f"got {field.unit!r}; allowed: a CloudWatch unit") from None
