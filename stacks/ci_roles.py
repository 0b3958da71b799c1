"""The promotion workflow's AWS side: GitHub's OIDC provider and one deploy role per environment, least privilege.

    npx cdk deploy --app "python3 -m stacks.ci_roles" -c githubRepository=<owner>/<repo> PEagleCiRoles

Deployed once per account, apart from the serving stages (its own app, so `make synth` and pull-request
diffs never touch it). A role trusts only a GitHub Actions job of ``githubRepository`` that runs in the
GitHub environment of its name (``repo:<owner>/<repo>:environment:dev``; the environments hold the
required reviewers), with the token's audience ``sts.amazonaws.com``: no long-lived keys anywhere.

What a role may do: assume the CDK bootstrap roles of its account and region (deploy, file and image
publishing, lookup - CloudFormation then acts with the bootstrap execution role, so the pipeline holds
no broad permissions itself), and what the smoke test needs on its own endpoint: invoke it, read its log
group, read its alarms. Nothing else.
"""

from __future__ import annotations

import re
import sys

from aws_cdk import App, ArnFormat, CfnOutput, Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

from peagle_constructs.errors import ConfigError
from peagle_constructs.sagemaker_names import container_log_group
from stacks.environments import ENVIRONMENTS, EnvironmentConfig
from stacks.serving_stack import stage_stack_name

GITHUB_OIDC_URL = "https://token.actions.githubusercontent.com"
GITHUB_AUDIENCE = "sts.amazonaws.com"
CDK_QUALIFIER = "hnb659fds"  # the CDK bootstrap's default qualifier
CDK_BOOTSTRAP_ROLES = ("deploy", "file-publishing", "image-publishing", "lookup")
STACK_ID = "PEagleCiRoles"
_REPOSITORY = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


def role_name(env: EnvironmentConfig) -> str:
    return f"peagle-deploy-{env.name.lower()}"


def github_environment(env: EnvironmentConfig) -> str:
    """The GitHub environment a deploy job of ``env`` runs in (the workflow's `environment:`)."""
    return env.name.lower()


class CiRolesStack(Stack):
    def __init__(self, scope: Construct, id: str = STACK_ID, *, repository: str,
                 environments: tuple[EnvironmentConfig, ...] = ENVIRONMENTS, **kwargs) -> None:
        if not isinstance(repository, str) or not _REPOSITORY.match(repository):
            raise ConfigError("githubRepository", f"got {repository!r}; allowed: '<owner>/<repo>' "
                                                  "(pass it with -c githubRepository=owner/repo)")
        super().__init__(scope, id, description="GitHub Actions OIDC deploy roles for the P-EAGLE stages",
                         **kwargs)
        provider = iam.OidcProviderNative(self, "GitHub", url=GITHUB_OIDC_URL, client_ids=[GITHUB_AUDIENCE])
        self.roles: dict[str, iam.Role] = {}
        for env in environments:
            principal = iam.WebIdentityPrincipal(provider.oidc_provider_arn, conditions={
                "StringEquals": {
                    "token.actions.githubusercontent.com:aud": GITHUB_AUDIENCE,
                    "token.actions.githubusercontent.com:sub":
                        f"repo:{repository}:environment:{github_environment(env)}",
                },
            })
            role = iam.Role(self, f"Deploy{env.name}", role_name=role_name(env), assumed_by=principal,
                            description=f"GitHub Actions deploys and smoke-tests the {env.name} stage")
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
            # The smoke test's first checks (harness.aws.live_config): the stage's stack as CloudFormation holds
            # it, and what SageMaker serves - the endpoint, its component, and the endpoint config and model they
            # name. Those two are named by CloudFormation at deploy time, so by any name; Describe reads only.
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
            self.roles[env.name] = role
            CfnOutput(self, f"{env.name}RoleArn", value=role.role_arn,
                      description=f"set as the GitHub environment '{github_environment(env)}' variable DEPLOY_ROLE_ARN")


def main() -> int:
    app = App()
    repository = app.node.try_get_context("githubRepository")
    try:
        CiRolesStack(app, repository=repository)
    except ConfigError as exc:
        print(f"ci_roles: {exc}", file=sys.stderr)
        return 2
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
