"""The metric filters that turn the runtime's per-request JSON lines into CloudWatch metrics.

Generated from :mod:`peagle_contract.request_log` (the schema the runtime writes), never from field names typed
here: one filter per metric field, its pattern, value and unit the schema's own.
"""

from __future__ import annotations

from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_logs as logs
from constructs import Construct

from peagle_contract import request_log
from peagle_contract.request_log import METRIC_FIELDS, MetricField

from peagle_constructs.errors import ConfigError

FIELDS_BY_METRIC: dict[str, MetricField] = {f.metric_name: f for f in METRIC_FIELDS}


def metric_filters(scope: Construct, *, log_group: logs.ILogGroup, namespace: str) -> dict[str, logs.MetricFilter]:
    """One metric filter per field of the request line, in ``scope`` (ids ``<metric name>Filter``), publishing to
    ``namespace``."""
    return {
        field.metric_name: logs.MetricFilter(
            scope, f"{field.metric_name}Filter",
            log_group=log_group,
            filter_pattern=logs.FilterPattern.literal(request_log.filter_pattern(field)),
            metric_namespace=namespace,
            metric_name=field.metric_name,
            metric_value=request_log.metric_value(field),
            unit=cloudwatch_unit(field),
        )
        for field in METRIC_FIELDS
    }


def request_field(metric_name: str) -> MetricField:
    """The schema's field behind ``metric_name``; a ConfigError naming the ones there are if none."""
    field = FIELDS_BY_METRIC.get(metric_name)
    if field is None:
        raise ConfigError("metric_name", f"got {metric_name!r}; allowed: one of {sorted(FIELDS_BY_METRIC)}")
    return field


def cloudwatch_unit(field: MetricField) -> cloudwatch.Unit:
    try:
        return cloudwatch.Unit[field.unit.upper()]
    except KeyError:
        raise ConfigError(f"request_log.{field.key}.unit", f"got {field.unit!r}; allowed: a CloudWatch unit") from None
