"""How an endpoint moves to a new config: blue/green traffic shifting or a rolling update, with a bake time
and auto-rollback on alarms.

Blue/green brings up a whole second fleet beside the old one before shifting traffic: the safest, but it
needs twice the GPU instances for the length of the update, which GPU quotas often refuse. A rolling
update replaces the fleet batch by batch (a batch of new instances comes up, bakes, then the same number of
old ones go), so it needs only one batch of extra instances.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import jsii
from aws_cdk import CfnDeletionPolicy, CfnResource, Duration, IStableListProducer, Lazy
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam

from peagle_constructs.errors import ConfigError
from peagle_constructs.validation import check_choice, check_duration, check_int

SHIFT_MODES = ("ALL_AT_ONCE", "CANARY", "LINEAR")
ROLLING = "ROLLING"
SIZE_UNITS = ("INSTANCE_COUNT", "CAPACITY_PERCENT", "COPY_COUNT")  # COPY_COUNT: inference components only
WAIT_MAX_S = 3600
MAX_ROLLBACK_ALARMS = 10  # SageMaker's AutoRollbackConfig
EXECUTION_TIMEOUT_MIN_S, EXECUTION_TIMEOUT_MAX_S = 600, 28800


@dataclass(frozen=True, kw_only=True)
class DeploymentPolicy:
    """Build it with :meth:`canary`, :meth:`linear` or :meth:`all_at_once` (blue/green), or :meth:`rolling`.

    ``bake`` is how long each step runs while the rollback alarms watch it; ``size`` (CANARY, LINEAR, ROLLING)
    is the share of the fleet moved per step, in instances or percent, and at most half the fleet so that
    a bad step never carries most of the traffic.
    """

    mode: str
    bake: Duration
    size: int | None = None
    size_unit: str = "CAPACITY_PERCENT"
    termination_wait: Duration = Duration.minutes(5)
    maximum_execution_timeout: Duration | None = None
    # ROLLING only: how many instances a rollback restores at a time; None: the whole old fleet at once.
    rollback_size: int | None = None
    rollback_size_unit: str = "CAPACITY_PERCENT"

    @property
    def is_rolling(self) -> bool:
        return self.mode == ROLLING

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
    def rolling(cls, *, percent: int | None = None, instances: int | None = None, copies: int | None = None,
                bake: Duration = Duration.minutes(10), rollback_percent: int | None = None,
                rollback_instances: int | None = None, rollback_copies: int | None = None,
                maximum_execution_timeout: Duration | None = None) -> "DeploymentPolicy":
        """Replace the fleet ``percent`` (5..50) or ``instances`` at a time - or, for an inference component,
        its model copies ``percent`` or ``copies`` at a time - each batch baking ``bake``."""
        size, unit = _size(percent, instances, copies)
        rollback, rollback_unit = ((None, "CAPACITY_PERCENT")
                                   if rollback_percent is None and rollback_instances is None and rollback_copies is None
                                   else _size(rollback_percent, rollback_instances, rollback_copies))
        return cls(mode=ROLLING, bake=bake, size=size, size_unit=unit, rollback_size=rollback,
                   rollback_size_unit=rollback_unit, maximum_execution_timeout=maximum_execution_timeout)

    @classmethod
    def all_at_once(cls, *, bake: Duration = Duration.minutes(5),
                    termination_wait: Duration = Duration.minutes(5)) -> "DeploymentPolicy":
        return cls(mode="ALL_AT_ONCE", bake=bake, termination_wait=termination_wait)

    def validate(self, *, instance_count: int, copies: bool = False) -> None:
        """``copies``: the policy rolls out an inference component, ``instance_count`` being its copy count."""
        if copies and not self.is_rolling:
            raise ConfigError("deployment.mode", f"got {self.mode!r} for an inference component; allowed: "
                              "DeploymentPolicy.rolling(...) (components update copy by copy)")
        units = ("COPY_COUNT", "CAPACITY_PERCENT") if copies else ("INSTANCE_COUNT", "CAPACITY_PERCENT")
        for name, unit in (("deployment.size_unit", self.size_unit),
                           ("deployment.rollback.size_unit", self.rollback_size_unit)):
            if unit not in units:
                raise ConfigError(name, f"got {unit!r} for {'an inference component' if copies else 'an endpoint'}; "
                                  f"allowed: {'copies= or percent=' if copies else 'instances= or percent='}")
        check_choice(self.mode, "deployment.mode", (*SHIFT_MODES, ROLLING))
        check_duration(self.bake, "deployment.bake", 0, WAIT_MAX_S)
        check_duration(self.termination_wait, "deployment.termination_wait", 0, WAIT_MAX_S)
        if self.maximum_execution_timeout is not None:
            check_duration(self.maximum_execution_timeout, "deployment.maximum_execution_timeout",
                           EXECUTION_TIMEOUT_MIN_S, EXECUTION_TIMEOUT_MAX_S)
        if self.mode == "ALL_AT_ONCE":
            return
        # A rolling batch is 5..50 % of the variant (SageMaker's RollingUpdatePolicy); a canary or linear step
        # 1..50 % (10..50 for linear), so that a bad step never carries most of the traffic.
        low = 5 if self.is_rolling else 10 if self.mode == "LINEAR" else 1
        _check_size(self.size, self.size_unit, "deployment", low=low, mode=self.mode, instance_count=instance_count)
        if self.is_rolling and self.rollback_size is not None:
            _check_size(self.rollback_size, self.rollback_size_unit, "deployment.rollback", low=1, high_percent=100,
                        mode=self.mode, instance_count=instance_count, at_most_half=False)

    def steps(self, instance_count: int) -> int:
        """Traffic steps (blue/green) or batches (rolling) an update of a fleet of ``instance_count`` (or a
        component of that many copies) takes."""
        if self.mode == "ALL_AT_ONCE":
            return 1
        if self.mode == "CANARY":
            return 2
        if self.size_unit in ("INSTANCE_COUNT", "COPY_COUNT"):
            return max(2, -(-instance_count // (self.size or 1)))
        return max(2, -(-100 // (self.size or 50)))

    def maximum_execution_seconds(self, instance_count: int) -> int:
        if self.maximum_execution_timeout is not None:
            return int(self.maximum_execution_timeout.to_seconds())
        # Enough for every step to bake plus an LLM's new instances to start (a rolling update starts new
        # instances for every batch), inside the service's limits.
        steps = self.steps(instance_count)
        starts = steps if self.is_rolling else 1
        wanted = 1800 * starts + steps * int(self.bake.to_seconds()) + int(self.termination_wait.to_seconds())
        return max(EXECUTION_TIMEOUT_MIN_S, min(EXECUTION_TIMEOUT_MAX_S, wanted))


def retain_when_replaced(resource: CfnResource) -> None:
    """Keep ``resource`` (a Model or EndpointConfig) when an update replaces it.

    After a rollout SageMaker rolls back, the endpoint is InService again on its previous config and model;
    CloudFormation, seeing the update end, would delete those in its cleanup, and the next instance SageMaker
    starts (scale-out, replacement) would have no model to load. The copies an endpoint no longer uses are
    listed and removed by ``make prune`` (harness/prune.py). A stack's deletion still deletes the current ones.
    """
    resource.cfn_options.update_replace_policy = CfnDeletionPolicy.RETAIN
    resource.cfn_options.deletion_policy = CfnDeletionPolicy.DELETE  # said outright: only replacement retains


@jsii.implements(IStableListProducer)
class _AlarmArns:
    def __init__(self, alarms: list[cloudwatch.IAlarm]) -> None:
        self.alarms = alarms

    def produce(self) -> list[str]:
        return [alarm.alarm_arn for alarm in self.alarms]


class RollbackAlarms:
    """A rollout's rollback alarms, and the read its execution role needs on them.

    SageMaker's deployment guardrails read the alarms as the endpoint's execution role
    (``cloudwatch:DescribeAlarms``, on those alarms): a role refused it never sees an alarm fire, and the
    rollout never rolls back. ``read`` grows with each alarm; attach it to every role the rollout runs as.
    """

    def __init__(self, alarms: Sequence[cloudwatch.IAlarm] = ()) -> None:
        self.alarms: list[cloudwatch.IAlarm] = []
        # Rendered at synth: alarms added after the grant are read too.
        self.read = iam.PolicyStatement(sid="ReadRollbackAlarms", actions=["cloudwatch:DescribeAlarms"],
                                        resources=Lazy.list(_AlarmArns(self.alarms)))
        self._readers: list[iam.ManagedPolicy] = []  # granted before the first alarm: attached with it
        for alarm in alarms:
            self.add(alarm)

    def add(self, alarm: cloudwatch.IAlarm) -> None:
        """Add ``alarm``, within SageMaker's AutoRollbackConfig limit."""
        if len(self.alarms) >= MAX_ROLLBACK_ALARMS:
            raise ConfigError("rollback_alarms", f"got a {len(self.alarms) + 1}th alarm; allowed: at most "
                              f"{MAX_ROLLBACK_ALARMS} (SageMaker's AutoRollbackConfig)")
        self.alarms.append(alarm)
        if len(self.alarms) == 1:  # a statement needs a resource: attached with the first alarm
            for policy in self._readers:
                policy.add_statements(self.read)

    def grant_read(self, policy: iam.ManagedPolicy) -> None:
        """Let the roles of ``policy`` read these alarms, those added later included."""
        self._readers.append(policy)
        if self.alarms:
            policy.add_statements(self.read)

    def __bool__(self) -> bool:
        return bool(self.alarms)

    def __iter__(self):
        return iter(self.alarms)


def _check_size(size: object, unit: str, prefix: str, *, low: int, mode: str, instance_count: int,
                high_percent: int = 50, at_most_half: bool = True) -> None:
    if unit not in SIZE_UNITS:
        raise ConfigError(f"{prefix}.size_unit", f"got {unit!r}; allowed: one of {SIZE_UNITS}")
    if unit == "COPY_COUNT":
        # SageMaker's rolling policy for components: a batch of 5..50 % of the copies. A whole copy is the
        # smallest batch there is, so a component of one copy updates one copy at a time.
        field = f"{prefix}.copies"
        high = max(1, instance_count // 2) if at_most_half else max(1, instance_count)
        check_int(size, field, 1, high, allowed=f"1..{high} for {instance_count} copies"
                  + (" (at most half the copies, one at least)" if at_most_half else ""))
    elif unit == "INSTANCE_COUNT":
        field = f"{prefix}.instances"
        high = instance_count // 2 if at_most_half else instance_count
        if high < 1:
            raise ConfigError(field, f"a {mode} step needs a fleet of at least 2 instances, got instance_count="
                              f"{instance_count}; allowed: DeploymentPolicy.all_at_once() for a single instance")
        check_int(size, field, 1, high, allowed=f"1..{high} for a fleet of {instance_count}"
                  + (" (at most half the fleet)" if at_most_half else ""))
    else:
        field = f"{prefix}.percent"
        check_int(size, field, low, high_percent, allowed=f"{low}..{high_percent} percent of the fleet")


def _size(percent: int | None, instances: int | None, copies: int | None = None) -> tuple[int | None, str]:
    given = [(value, unit) for value, unit in ((percent, "CAPACITY_PERCENT"), (instances, "INSTANCE_COUNT"),
                                               (copies, "COPY_COUNT")) if value is not None]
    if len(given) != 1:
        raise ConfigError("deployment", "give exactly one of percent=, instances= or copies=")
    return given[0]
