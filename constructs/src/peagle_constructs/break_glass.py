"""A deploy without automatic rollback, for a hotfix during an incident - asked for in code, never by accident.

During an incident the rollback alarms may already be in ALARM (that is often the incident): a fix deployed
with auto-rollback armed is rolled back at once. Setting the CDK context ``peagle:break-glass`` to the incident
and why (``"INC-1234: hotfix for the tokenizer crash"``) renders every endpoint and inference component of the
app without ``AutoRollbackConfiguration``; the alarms still exist and still page. The reason is written on each
resource as the tag ``peagle:break-glass``, synth prints a warning, and the pull-request stack diff fails the
change with a BREAK-GLASS finding (review/stack_diff.py), so it is merged only past a reviewer who saw it. Remove
the context in the next change: that diff shows the rollback armed again. See docs/serving.md.
"""

from __future__ import annotations

import re

from aws_cdk import Annotations, CfnResource, Tags
from constructs import Construct

from peagle_constructs.errors import ConfigError

BREAK_GLASS_CONTEXT = "peagle:break-glass"
BREAK_GLASS_TAG = "peagle:break-glass"
# What a CloudFormation tag value may hold; long enough to say which incident and why.
_REASON = re.compile(r"^[\w .:/=+\-@]{10,256}$")


def break_glass(scope: Construct) -> str | None:
    """The reason given for deploying without automatic rollback, or None (the normal case)."""
    reason = scope.node.try_get_context(BREAK_GLASS_CONTEXT)
    if reason is None or reason == "":
        return None
    if not isinstance(reason, str) or not _REASON.match(reason):
        raise ConfigError(BREAK_GLASS_CONTEXT, f"got {str(reason)[:40]!r}; allowed: the incident and why, 10-256 of "
                          "letters, digits, spaces and _ . : / = + - @ (e.g. 'INC-1234: hotfix for the tokenizer crash')")
    return reason


def mark_break_glass(resource: CfnResource) -> bool:
    """Tag ``resource`` and warn at synth when this is a break-glass deploy; whether it is."""
    reason = break_glass(resource)
    if reason is None:
        return False
    Tags.of(resource).add(BREAK_GLASS_TAG, reason)
    Annotations.of(resource).add_warning_v2("peagle:break-glass", f"deployed WITHOUT automatic rollback: {reason}")
    return True
