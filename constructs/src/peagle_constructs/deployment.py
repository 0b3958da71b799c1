"""How an endpoint moves to a new config: blue/green traffic shifting with a bake time and auto-rollback."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration

from peagle_constructs.errors import ConfigError

SHIFT_MODES = ("ALL_AT_ONCE", "CANARY", "LINEAR")
SIZE_UNITS = ("INSTANCE_COUNT", "CAPACITY_PERCENT")
WAIT_MAX_S = 3600
EXECUTION_TIMEOUT_MIN_S, EXECUTION_TIMEOUT_MAX_S = 600, 28800


@dataclass(frozen=True, kw_only=True)
class DeploymentPolicy:
    """Blue/green traffic shifting. Build it with :meth:`canary`, :meth:`linear` or :meth:`all_at_once`.

    ``bake`` is how long each traffic step runs while the rollback alarms watch it; ``size`` (CANARY, LINEAR)
    is the share of the fleet moved per step, in instances or percent, and at most half the fleet so that
    a bad step never carries most of the traffic.
    """

    mode: str
    bake: Duration
    size: int | None = None
    size_unit: str = "CAPACITY_PERCENT"
    termination_wait: Duration = Duration.minutes(5)
    maximum_execution_timeout: Duration | None = None

    @classmethod
    def canary(cls, *, percent: int | None = None, instances: int | None = None,
               bake: Duration = Duration.minutes(10), termination_wait: Duration = Duration.minutes(5)) -> "DeploymentPolicy":
        size, unit = _size(percent, instances)
        return cls(mode="CANARY", bake=bake, size=size, size_unit=unit, termination_wait=termination_wait)

    @classmethod
    def linear(cls, *, percent: int | None = None, instances: int | None = None,
               bake: Duration = Duration.minutes(10), termination_wait: Duration = Duration.minutes(5)) -> "DeploymentPolicy":
        size, unit = _size(percent, instances)
        return cls(mode="LINEAR", bake=bake, size=size, size_unit=unit, termination_wait=termination_wait)

    @classmethod
    def all_at_once(cls, *, bake: Duration = Duration.minutes(5),
                    termination_wait: Duration = Duration.minutes(5)) -> "DeploymentPolicy":
        return cls(mode="ALL_AT_ONCE", bake=bake, termination_wait=termination_wait)

    def validate(self, *, instance_count: int) -> None:
        if self.mode not in SHIFT_MODES:
            raise ConfigError("deployment.mode", f"got {self.mode!r}; allowed: one of {SHIFT_MODES}")
        for name, value in (("deployment.bake", self.bake), ("deployment.termination_wait", self.termination_wait)):
            if not isinstance(value, Duration) or not 0 <= value.to_seconds() <= WAIT_MAX_S:
                raise ConfigError(name, f"got {value!r}; allowed: a Duration of 0..{WAIT_MAX_S} s")
        if self.maximum_execution_timeout is not None:
            seconds = self.maximum_execution_timeout.to_seconds()
            if not EXECUTION_TIMEOUT_MIN_S <= seconds <= EXECUTION_TIMEOUT_MAX_S:
                raise ConfigError("deployment.maximum_execution_timeout",
                                  f"got {seconds} s; allowed: {EXECUTION_TIMEOUT_MIN_S}..{EXECUTION_TIMEOUT_MAX_S} s")
        if self.mode == "ALL_AT_ONCE":
            return
        if self.size_unit not in SIZE_UNITS:
            raise ConfigError("deployment.size_unit", f"got {self.size_unit!r}; allowed: one of {SIZE_UNITS}")
        field = "deployment.instances" if self.size_unit == "INSTANCE_COUNT" else "deployment.percent"
        if self.size_unit == "INSTANCE_COUNT":
            half = instance_count // 2
            if half < 1:
                raise ConfigError(field, f"a {self.mode} step needs a fleet of at least 2 instances, got instance_count="
                                  f"{instance_count}; allowed: DeploymentPolicy.all_at_once() for a single instance")
            if not isinstance(self.size, int) or not 1 <= self.size <= half:
                raise ConfigError(field, f"got {self.size!r} for a fleet of {instance_count}; allowed: 1..{half} "
                                  "(at most half the fleet)")
        else:
            low = 10 if self.mode == "LINEAR" else 1
            if not isinstance(self.size, int) or not low <= self.size <= 50:
                raise ConfigError(field, f"got {self.size!r}; allowed: {low}..50 percent of the fleet")

    def maximum_execution_seconds(self) -> int:
        if self.maximum_execution_timeout is not None:
            return int(self.maximum_execution_timeout.to_seconds())
        # Enough for every step to bake plus an LLM's new fleet to start, inside the service's limits.
        steps = 1 if self.mode == "ALL_AT_ONCE" else (2 if self.mode == "CANARY" else max(2, 100 // (self.size or 50)))
        wanted = 3600 + steps * int(self.bake.to_seconds()) + int(self.termination_wait.to_seconds())
        return max(EXECUTION_TIMEOUT_MIN_S, min(EXECUTION_TIMEOUT_MAX_S, wanted))


def _size(percent: int | None, instances: int | None) -> tuple[int | None, str]:
    if (percent is None) == (instances is None):
        raise ConfigError("deployment", "give exactly one of percent= or instances=")
    return (percent, "CAPACITY_PERCENT") if percent is not None else (instances, "INSTANCE_COUNT")
