"""Each stage account's delivery side: GitHub's OIDC provider, the stage's deploy role bound to the reviewed
workflow on main, and the CloudFormation execution policy and workload boundary its bootstrap hands out.

    npx cdk deploy --app "python3 -m stacks.ci_roles" -c githubRepository=<owner>/<repo> \\
        -c account.Dev=<id> -c account.Staging=<id> -c account.Prod=<id> -c region=<region> --all

One stack per account (``PEagleCiRoles-<stage>``; stages that share an account, acknowledged in their config,
share one), deployed once by the account's administrator with their own credentials (the stack needs no CDK
bootstrap: the bootstrap comes after it, with its execution policy). Then, in each account::

    npx cdk bootstrap aws://<account>/<region> --cloudformation-execution-policies \\
        arn:aws:iam::<account>:policy/peagle-cfn-execution-iam,arn:aws:iam::<account>:policy/peagle-cfn-execution-serving,\\
arn:aws:iam::<account>:policy/peagle-cfn-execution-observability,\\
arn:aws:iam::<account>:policy/peagle-cfn-execution-capture,arn:aws:iam::<account>:policy/peagle-cfn-execution-training

(the stack's ``BootstrapCommand`` output prints it). The deploy role trusts one GitHub token only: audience
``sts.amazonaws.com`` and the subject :func:`deploy_subject` - this repository, the stage's GitHub environment,
a run on main, and the job of ``.github/workflows/deploy-stage.yml`` at main. AWS matches only ``aud`` and
``sub``, so the repository's OIDC subject template must include those claims (set once with GitHub's API:
docs/workflows.md gives the command); a token from another branch, workflow, environment or repository carries
another subject and is refused. What the role may do: assume its account's CDK bootstrap roles (CloudFormation
then acts with the execution policy of :mod:`stacks.deploy_permissions`, not administrator) and what the smoke
test needs on its own endpoint. Nothing else.
"""

from __future__ import annotations

import re
import sys
from typing import Sequence

from aws_cdk import App, ArnFormat, CfnOutput, CliCredentialsStackSynthesizer, Environment, Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

from peagle_constructs.errors import ConfigError
from peagle_constructs.sagemaker_names import container_log_group
from stacks.deploy_permissions import (
    BOUNDARY_NAME, CDK_QUALIFIER, boundary_statements, execution_statements, stage_names,
)
from stacks.environments import ENVIRONMENTS, EnvironmentConfig
from stacks.isolation import check_separate_accounts, offline, place
from stacks.serving_stack import stage_stack_name

GITHUB_OIDC_URL = "https://token.actions.githubusercontent.com"
GITHUB_AUDIENCE = "sts.amazonaws.com"
OIDC_CLAIM_PREFIX = "token.actions.githubusercontent.com"
# The claims the repository's OIDC subject template must include, in this order (GitHub's API, set once).
SUBJECT_CLAIM_KEYS = ("repo", "context", "ref", "job_workflow_ref")
DEPLOY_WORKFLOW = ".github/workflows/deploy-stage.yml"
MAIN_REF = "refs/heads/main"
CDK_BOOTSTRAP_ROLES = ("deploy", "file-publishing", "image-publishing", "lookup")
STACK_ID_PREFIX = "PEagleCiRoles"
_REPOSITORY = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


def role_name(env: EnvironmentConfig) -> str:
    return f"peagle-deploy-{env.name.lower()}"


def github_environment(env: EnvironmentConfig) -> str:
    """The GitHub environment a deploy job of ``env`` runs in (the workflow's `environment:`)."""
    return env.name.lower()


def deploy_subject(repository: str, env: EnvironmentConfig) -> str:
    """The ``sub`` of the one token ``env``'s role trusts, as GitHub renders it for :data:`SUBJECT_CLAIM_KEYS`:
    each claim as ``key:value`` (``context`` as its value alone, ``environment:<name>`` for a deployment job)."""
    return (f"repo:{repository}:environment:{github_environment(env)}:ref:{MAIN_REF}"
            f":job_workflow_ref:{repository}/{DEPLOY_WORKFLOW}@{MAIN_REF}")


class CiRolesStack(Stack):
    """The delivery side of one account: ``environments`` are the stages deployed into it."""

    def __init__(self, scope: Construct, id: str, *, repository: str, environments: Sequence[EnvironmentConfig],
                 **kwargs) -> None:
        if not isinstance(repository, str) or not _REPOSITORY.match(repository):
            raise ConfigError("githubRepository", f"got {str(repository)[:80]!r}; allowed: '<owner>/<repo>' "
                                                  "(pass it with -c githubRepository=owner/repo)")
        if not environments:
            raise ConfigError("environments", "empty; allowed: the stages deployed into this account")
        # The administrator deploys it with their own credentials: the CDK bootstrap (whose execution policy
        # this stack creates) comes after it.
        kwargs.setdefault("synthesizer", CliCredentialsStackSynthesizer())
        super().__init__(scope, id, description=f"GitHub Actions OIDC deploy roles, CloudFormation execution policy "
                                                f"and workload boundary for the P-EAGLE stage(s) {stage_names(environments)}",
                         **kwargs)
        provider = iam.OidcProviderNative(self, "GitHub", url=GITHUB_OIDC_URL, client_ids=[GITHUB_AUDIENCE])
        self.boundary = iam.ManagedPolicy(
            self, "WorkloadBoundary", managed_policy_name=BOUNDARY_NAME,
            description="The most any role a P-EAGLE stage creates may do (its permissions boundary)",
            statements=boundary_statements(self, environments))
        self.execution_policies = [
            iam.ManagedPolicy(self, f"CloudFormationExecution{index}", managed_policy_name=name,
                              description="What CloudFormation may do when it deploys the P-EAGLE stages (cdk "
                                          "bootstrap --cloudformation-execution-policies)",
                              statements=statements)
            for index, (name, statements) in enumerate(execution_statements(self, environments).items())]
        self.roles: dict[str, iam.Role] = {}
        for env in environments:
            self.roles[env.name] = self._deploy_role(provider, repository, env)
        CfnOutput(self, "BootstrapCommand", description="bootstrap this account with the scoped execution policy",
                  value=f"npx cdk bootstrap aws://{self.account}/{self.region} --cloudformation-execution-policies "
                        + ",".join(p.managed_policy_arn for p in self.execution_policies))

    def _deploy_role(self, provider: iam.OidcProviderNative, repository: str, env: EnvironmentConfig) -> iam.Role:
        principal = iam.WebIdentityPrincipal(provider.oidc_provider_arn, conditions={"StringEquals": {
            f"{OIDC_CLAIM_PREFIX}:aud": GITHUB_AUDIENCE,
            f"{OIDC_CLAIM_PREFIX}:sub": deploy_subject(repository, env),
        }})
        role = iam.Role(self, f"Deploy{env.name}", role_name=role_name(env), assumed_by=principal,
                        description=f"GitHub Actions deploys and smoke-tests the {env.name} stage (deploy-stage.yml "
                                    "on main only)")
        role.add_to_policy(iam.PolicyStatement(
            sid="CdkBootstrapRoles", actions=["sts:AssumeRole"],
            resources=[self.format_arn(service="iam", region="", resource="role",
                                       resource_name=f"cdk-{CDK_QUALIFIER}-{kind}-role-{self.account}-{self.region}")
                       for kind in CDK_BOOTSTRAP_ROLES]))
        endpoint = env.endpoint_name
        # InvokeEndpointWithResponseStream is authorized by this same action (its API reference says so).
        role.add_to_policy(iam.PolicyStatement(
            sid="SmokeInvoke", actions=["sagemaker:InvokeEndpoint"],
            resources=[self.format_arn(service="sagemaker", resource="endpoint", resource_name=endpoint)]))
        component = env.component_name
        # The request lines go to the component's log group when the endpoint hosts components.
        log_group = container_log_group(endpoint, component)
        role.add_to_policy(iam.PolicyStatement(
            sid="SmokeLogs", actions=["logs:FilterLogEvents"],
            resources=[self.format_arn(service="logs", resource="log-group", resource_name=f"{log_group}:*",
                                       arn_format=ArnFormat.COLON_RESOURCE_NAME)]))
        # The smoke test's first checks (ops.live_config): the stage's stack as CloudFormation holds it, and
        # what SageMaker serves - the endpoint, its component, and the endpoint config and model they name. Those
        # two are named by CloudFormation at deploy time, so by any name; Describe reads only.
        role.add_to_policy(iam.PolicyStatement(
            sid="SmokeStack", actions=["cloudformation:DescribeStackResources", "cloudformation:GetTemplate"],
            resources=[self.format_arn(service="cloudformation", resource="stack",
                                       resource_name=f"{stage_stack_name(env.name)}/*")]))
        role.add_to_policy(iam.PolicyStatement(
            sid="SmokeDescribe",
            actions=["sagemaker:DescribeEndpoint", "sagemaker:DescribeEndpointConfig", "sagemaker:DescribeModel",
                     *(["sagemaker:DescribeInferenceComponent"] if component else [])],
            resources=[self.format_arn(service="sagemaker", resource="endpoint", resource_name=endpoint),
                       self.format_arn(service="sagemaker", resource="endpoint-config", resource_name="*"),
                       self.format_arn(service="sagemaker", resource="model", resource_name="*"),
                       *([self.format_arn(service="sagemaker", resource="inference-component",
                                          resource_name=component)] if component else [])]))
        role.add_to_policy(iam.PolicyStatement(
            sid="SmokeAlarms", actions=["cloudwatch:DescribeAlarms"],
            resources=[self.format_arn(service="cloudwatch", resource="alarm", resource_name=f"{endpoint}-*",
                                       arn_format=ArnFormat.COLON_RESOURCE_NAME)]))
        CfnOutput(self, f"{env.name}RoleArn", value=role.role_arn,
                  description=f"the role deploy-stage.yml assumes for {env.name} (the GitHub environment "
                              f"'{github_environment(env)}')")
        return role


def build_ci_app(app: App, repository: str,
                 environments: Sequence[EnvironmentConfig] = ENVIRONMENTS) -> dict[str, CiRolesStack]:
    """One stack per account the stages deploy into, by stack id; the stages placed as the serving app places them
    (the same accounts, the same separation rule)."""
    placements = [place(app, env) for env in environments]
    if not offline(app):
        check_separate_accounts(placements)
    by_account: dict[str, list] = {}
    for p in placements:
        by_account.setdefault(p.account, []).append(p)
    stacks = {}
    for account, group in by_account.items():
        # IAM is global to an account: its OIDC provider and policies are one set, whatever the stages' regions.
        regions = sorted({p.region for p in group})
        if len(regions) > 1:
            raise ConfigError(f"{group[1].config.name}.region", f"got {regions[1]!r}, but it shares account {account} "
                              f"with {group[0].config.name} in {regions[0]!r}; allowed: one region per shared account")
        envs = [p.config for p in group]
        stack_id = f"{STACK_ID_PREFIX}-{stage_names(envs)}"
        stacks[stack_id] = CiRolesStack(app, stack_id, repository=repository, environments=envs,
                                        env=Environment(account=account, region=regions[0]))
    return stacks


def main() -> int:
    app = App()
    try:
        build_ci_app(app, app.node.try_get_context("githubRepository"))
    except ConfigError as exc:
        print(f"ci_roles: {exc}", file=sys.stderr)
        return 2
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
