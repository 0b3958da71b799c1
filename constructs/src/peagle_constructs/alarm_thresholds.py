"""When an endpoint's alarms fire: the thresholds, periods and sample floors every alarm of it is built from.

Its own module because two sides hold it: :class:`~peagle_constructs.props.ModelProps` (an environment's
configuration) and the alarms that read it (:mod:`peagle_constructs.alarms`).
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration

from peagle_constructs.errors import ConfigError
from peagle_constructs.validation import check_duration, check_int, check_number, check_positive


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
