"""What the promotion reads from the cloud assembly it deploys (promote.yml's synth job, deploy-stage.yml).

    python -m ops.promotion target --assembly cdk.out --stage Dev        (step outputs of a deploy job)
    python -m ops.promotion digests --assembly cdk.out --revision SHA    (the synth job's summary)

``target``: where a stage deploys - the account and region its stacks' manifest entries name, and the deploy
role there, ``arn:aws:iam::<account>:role/<stacks.ci_roles.role_name>`` - so a job assumes a role in the
account the reviewed code synthesized for that stage, never one a repository variable names beside it.

``digests``: per stack, the SHA-256 of the template as deployed, and as reviewed: the SHA-256 the same
template has when synthesized for review (``-c offline=true``: the placeholder account and region, no
``gitRevision``), got by putting those values back into the deployed bytes. That second digest is what the
stack-diff comment records for the pull request's head; the two are equal when the merged tree is the
reviewed one and the app synthesizes the same template for review as for an account (an app that renders a
harmless template for review and another for promotion shows here as a mismatch).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ops import cdk

# The only partition the app targets (cdk.json: @aws-cdk/core:target-partitions).
PARTITION = "aws"
# What stacks/serving_stack.py writes as GitRevision when no -c gitRevision is given (a synth for review).
UNSET_REVISION = "unset"


@dataclass(frozen=True)
class Target:
    stage: str
    account: str
    region: str
    role_arn: str

    def outputs(self) -> str:
        """``name=value`` lines for ``$GITHUB_OUTPUT``."""
        return f"account={self.account}\nregion={self.region}\nrole-arn={self.role_arn}\n"


def deploy_role_name(stage: str) -> str:
    """The deploy role of ``stage`` as stacks/ci_roles.py names it (one rule, read from there)."""
    for name, value in cdk.QUIET_CDK_ENV.items():  # importing the stacks starts jsii: no banner in the job's log
        os.environ.setdefault(name, value)
    from stacks.ci_roles import role_name
    from stacks.environments import ENVIRONMENTS

    configs = {config.name: config for config in ENVIRONMENTS}
    if stage not in configs:
        raise cdk.CdkError(f"--stage: allowed: {', '.join(configs)}; found: {stage!r}")
    return role_name(configs[stage])


def target(assembly: Path, stage: str) -> Target:
    account, region = cdk.stage_environment(assembly, stage)
    return Target(stage, account, region, f"arn:{PARTITION}:iam::{account}:role/{deploy_role_name(stage)}")


@dataclass(frozen=True)
class StackDigest:
    display_name: str
    account: str | None
    region: str | None
    deployed: str  # SHA-256 of the template file
    as_reviewed: str  # SHA-256 of the same bytes with the review synth's placeholders put back


def review_form(template: bytes, *, account: str | None, region: str | None, revision: str | None,
                review_account: str, review_region: str) -> bytes:
    """``template`` as a synth for review would have written it: its account, region and revision replaced by
    what that synth uses. Byte for byte, so the digest is comparable with the comment's."""
    text = template.decode("utf-8")
    # The revision first: a 40-hex commit could, by chance, hold an account's 12 digits.
    for real, placeholder in ((revision, UNSET_REVISION), (account, review_account), (region, review_region)):
        if real:
            text = text.replace(real, placeholder)
    return text.encode("utf-8")


def digests(assembly: Path, *, revision: str | None) -> list[StackDigest]:
    from stacks.application import OFFLINE_ACCOUNT, OFFLINE_REGION

    rows = []
    for stack in cdk.list_stacks(assembly):
        raw = stack.template_path.read_bytes()
        reviewed = review_form(raw, account=stack.account, region=stack.region, revision=revision,
                               review_account=OFFLINE_ACCOUNT, review_region=OFFLINE_REGION)
        rows.append(StackDigest(stack.display_name, stack.account, stack.region, stack.template_sha256(),
                                hashlib.sha256(reviewed).hexdigest()))
    return rows


def digests_markdown(rows: list[StackDigest], *, revision: str | None) -> str:
    lines = ["### Templates deployed (SHA-256)", "",
             f"Synthesized once from `{revision or 'the working tree'}`; every stage deploys this assembly. "
             "*As reviewed*: the digest of the same template synthesized for review (placeholder account and "
             "region, no revision), which the pull request's stack-diff comment records for its head: equal when "
             "the merged tree is the reviewed one.", "",
             "| stack | account / region | deployed | as reviewed |", "|---|---|---|---|"]
    lines += [f"| `{r.display_name}` | {r.account}/{r.region} | `{r.deployed}` | `{r.as_reviewed}` |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.promotion", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    where = sub.add_parser("target", help="account, region and deploy role of a stage (step outputs)")
    where.add_argument("--assembly", type=Path, required=True)
    where.add_argument("--stage", required=True)
    digest = sub.add_parser("digests", help="each template's SHA-256, deployed and as reviewed (Markdown)")
    digest.add_argument("--assembly", type=Path, required=True)
    digest.add_argument("--revision", help="the -c gitRevision the synth was given")
    args = parser.parse_args(argv)
    try:
        if args.command == "target":
            found = target(args.assembly, args.stage)
            sys.stdout.write(found.outputs())
            print(f"{found.stage} deploys to {found.account}/{found.region} as {found.role_arn}", file=sys.stderr)
        else:
            sys.stdout.write(digests_markdown(digests(args.assembly, revision=args.revision), revision=args.revision))
    except cdk.CdkError as error:
        print(f"::error::{error}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
