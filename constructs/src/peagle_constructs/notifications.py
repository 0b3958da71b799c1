"""Who is told when an endpoint's alarms change state, and the topic that lets CloudWatch tell them.

A topic policy replaces SNS's default policy, so a TLS-only topic (``enforce_ssl``) allows nothing unless
it says so: :class:`AlarmTopic` allows ``sns:Publish`` to ``cloudwatch.amazonaws.com`` for this account's
alarms whose names start with the endpoint's prefix, and lets the same principal, on the same conditions,
use the topic's KMS key (CloudWatch needs ``kms:GenerateDataKey*`` and ``kms:Decrypt`` to publish to an
encrypted topic). The conditions (``aws:SourceAccount``, ``aws:SourceArn``) keep the service from acting for
anyone else's alarms: the confused-deputy guard AWS documents for service principals.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from aws_cdk import Aws
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from constructs import Construct

from peagle_constructs.errors import ConfigError

CLOUDWATCH_PRINCIPAL = "cloudwatch.amazonaws.com"
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_TOPIC_ARN = re.compile(r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,256}$")


@dataclass(frozen=True)
class AlarmSubscriber:
    """One receiver of alarm notifications. Build with :meth:`email`, :meth:`https` or :meth:`topic`."""

    kind: str  # "email" | "https" | "topic"
    target: str

    @classmethod
    def email(cls, address: str) -> "AlarmSubscriber":
        """An email address; SNS sends it a confirmation link first (until confirmed, nothing is delivered)."""
        if not isinstance(address, str) or not _EMAIL.match(address):
            raise ConfigError("alarm_subscribers.email", f"got {address!r}; allowed: an email address")
        return cls("email", address)

    @classmethod
    def https(cls, url: str) -> "AlarmSubscriber":
        """An HTTPS endpoint (a pager or incident tool's SNS webhook); it must confirm the subscription."""
        if not isinstance(url, str) or not url.startswith("https://") or len(url) <= len("https://"):
            raise ConfigError("alarm_subscribers.https", f"got {url!r}; allowed: an https:// URL")
        return cls("https", url)

    @classmethod
    def topic(cls, topic_arn: str) -> "AlarmSubscriber":
        """An existing SNS topic - a team's alerting topic, or the one an AWS Chatbot (Amazon Q Developer in
        chat applications) channel reads. SNS has no topic-to-topic subscription, so the alarms publish to it
        directly; its own policy must allow cloudwatch.amazonaws.com to publish (and its key, if encrypted)."""
        if not isinstance(topic_arn, str) or not _TOPIC_ARN.match(topic_arn):
            raise ConfigError("alarm_subscribers.topic",
                              f"got {topic_arn!r}; allowed: an SNS topic ARN 'arn:aws:sns:<region>:<account>:<name>'")
        return cls("topic", topic_arn)


def alarm_arn_pattern(alarm_name_prefix: str) -> str:
    """The ARNs of this account's alarms in this region whose names start with ``alarm_name_prefix``."""
    return f"arn:{Aws.PARTITION}:cloudwatch:{Aws.REGION}:{Aws.ACCOUNT_ID}:alarm:{alarm_name_prefix}*"


def cloudwatch_conditions(alarm_name_prefix: str) -> dict:
    return {"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID},
            "ArnLike": {"aws:SourceArn": alarm_arn_pattern(alarm_name_prefix)}}


class AlarmTopic(Construct):
    """A KMS-encrypted, TLS-only SNS topic that this endpoint's alarms can publish to, and its subscribers.

    ``alarm_name_prefix``: every alarm that publishes here is named with it (the conditions name no others).
    ``targets`` are the topics the alarms publish to: this one and each ``AlarmSubscriber.topic``.
    """

    def __init__(self, scope: Construct, id: str, *, key: kms.IKey, alarm_name_prefix: str,
                 subscribers: Sequence[AlarmSubscriber] = (), display_name: str | None = None) -> None:
        super().__init__(scope, id)
        for index, subscriber in enumerate(subscribers):
            if not isinstance(subscriber, AlarmSubscriber):
                raise ConfigError(f"alarm_subscribers[{index}]", f"got {subscriber!r}; allowed: an AlarmSubscriber "
                                  "(AlarmSubscriber.email(...), .https(...) or .topic(...))")
        self.alarm_name_prefix = alarm_name_prefix
        conditions = cloudwatch_conditions(alarm_name_prefix)
        key.add_to_resource_policy(iam.PolicyStatement(
            sid="AlarmsPublishThroughThisKey",
            principals=[iam.ServicePrincipal(CLOUDWATCH_PRINCIPAL)],
            actions=["kms:Decrypt", "kms:GenerateDataKey*"], resources=["*"], conditions=conditions,
        ))
        self.topic = sns.Topic(self, "Resource", master_key=key, enforce_ssl=True, display_name=display_name)
        self.topic.add_to_resource_policy(iam.PolicyStatement(
            sid="AlarmsOfThisEndpointPublish",
            principals=[iam.ServicePrincipal(CLOUDWATCH_PRINCIPAL)],
            actions=["sns:Publish"], resources=[self.topic.topic_arn], conditions=conditions,
        ))
        self.targets: list[sns.ITopic] = [self.topic]
        for index, subscriber in enumerate(subscribers):
            if subscriber.kind == "topic":
                self.targets.append(sns.Topic.from_topic_arn(self, f"Existing{index}", subscriber.target))
            else:
                protocol = sns.SubscriptionProtocol.EMAIL if subscriber.kind == "email" else sns.SubscriptionProtocol.HTTPS
                sns.Subscription(self, f"Subscriber{index}", topic=self.topic, protocol=protocol,
                                 endpoint=subscriber.target)
