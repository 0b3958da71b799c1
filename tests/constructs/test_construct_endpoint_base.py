"""Endpoints as other constructs use them: CDK's aws_sagemaker.IEndpoint (API Gateway's SageMaker integration takes
ours, built or imported), imported by name or ARN in the right environment, invoke grants, metrics with CDK's
options."""

from __future__ import annotations

import pytest
from aws_cdk import Duration, Stack, Token
from aws_cdk import aws_apigateway as apigateway
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Template

from construct_helpers import as_text, statements

from peagle_constructs import (
    ConfigError, EndpointBase, FleetProps, ModelProps, PEagleComponentEndpoint, PEagleEndpoint,
)


def _grant_resource(stack, endpoint) -> str:
    role = iam.Role(stack, "Caller", assumed_by=iam.AccountRootPrincipal())
    endpoint.grant_invoke(role)
    (policy,) = Template.from_stack(stack).find_resources("AWS::IAM::Policy").values()
    (statement,) = statements(policy)
    assert statement["Action"] == ["sagemaker:InvokeEndpoint", "sagemaker:InvokeEndpointWithResponseStream"]
    return as_text(statement["Resource"])


def _integration(template: dict, path: str) -> tuple[dict, list[dict]]:
    """The SageMaker integration of ``POST /<path>`` and the statements of its role's policies."""
    resources = template["Resources"]
    (part,) = [lid for lid, r in resources.items()
               if r["Type"] == "AWS::ApiGateway::Resource" and r["Properties"]["PathPart"] == path]
    (method,) = [r["Properties"] for r in resources.values()
                 if r["Type"] == "AWS::ApiGateway::Method" and r["Properties"]["ResourceId"] == {"Ref": part}]
    integration = method["Integration"]
    role = integration["Credentials"]["Fn::GetAtt"][0]
    granted = [s for r in resources.values() if r["Type"] == "AWS::IAM::Policy" and {"Ref": role} in r["Properties"]["Roles"]
               for s in statements(r)]
    return integration, granted


def test_api_gateways_sagemaker_integration_takes_our_endpoints_built_or_imported(stack, serving, image):
    """CDK's own consumer of aws_sagemaker.IEndpoint is the judge: it reads endpoint_name and calls grant_invoke
    (before EndpointBase implemented the interface: "this.endpoint.grantInvoke is not a function")."""
    built = PEagleEndpoint(stack, "Serving", model=ModelProps(serving=serving), image=image,
                           fleet=FleetProps(instance_type="ml.g6e.xlarge"))
    endpoints = {
        "built": (built, "Test-Serving", "test-serving"),
        "byname": (PEagleEndpoint.from_endpoint_name(stack, "ByName", "Team-LLM"), "Team-LLM", "team-llm"),
        "byarn": (PEagleEndpoint.from_endpoint_arn(stack, "ByArn", "arn:aws:sagemaker:eu-west-1:333333333333:"
                                                   "endpoint/peagle-prod"), "peagle-prod", "peagle-prod"),
    }
    api = apigateway.RestApi(stack, "Api")
    for path, (endpoint, _, _) in endpoints.items():
        api.root.add_resource(path).add_method("POST", apigateway.SagemakerIntegration(endpoint))
    template = Template.from_stack(stack).to_json()
    for path, (endpoint, name, arn_name) in endpoints.items():
        integration, granted = _integration(template, path)
        uri = as_text(integration["Uri"])
        assert ":apigateway:eu-west-1:runtime.sagemaker:path/" in uri, path
        assert f"path/endpoints/{name}/invocations" in uri, path
        # The integration's role may invoke exactly this endpoint, and nothing else.
        (statement,) = granted
        assert statement["Action"] == ["sagemaker:InvokeEndpoint", "sagemaker:InvokeEndpointWithResponseStream"]
        assert statement["Resource"] == stack.resolve(endpoint.endpoint_arn), path
        assert f":endpoint/{arn_name}" in as_text(statement["Resource"]), path


def test_an_import_by_arn_is_in_the_arns_account_and_region(stack, serving, image):
    imported = PEagleEndpoint.from_endpoint_arn(stack, "Prod", "arn:aws:sagemaker:us-east-2:444444444444:endpoint/p")
    assert (imported.env.account, imported.env.region) == ("444444444444", "us-east-2")
    assert imported.endpoint_ref.endpoint_arn == "arn:aws:sagemaker:us-east-2:444444444444:endpoint/p"
    by_name = PEagleEndpoint.from_endpoint_name(stack, "Here", "here")
    built = PEagleEndpoint(stack, "Serving", model=ModelProps(serving=serving), image=image,
                           fleet=FleetProps(instance_type="ml.g6e.xlarge"))
    for endpoint in (by_name, built):
        assert (endpoint.env.account, endpoint.env.region) == ("333333333333", "eu-west-1")
        assert endpoint.stack is Stack.of(stack)


def test_an_endpoint_imported_by_name_grants_invoke_on_its_lower_cased_arn(stack):
    imported = PEagleEndpoint.from_endpoint_name(stack, "Shared", "Team-LLM")
    assert isinstance(imported, EndpointBase)
    assert imported.endpoint_name == "Team-LLM"
    assert _grant_resource(stack, imported).endswith(':endpoint/team-llm"]]}')
    # CloudWatch keeps the name's own case.
    assert imported.metric_invocations().dimensions == {"EndpointName": "Team-LLM", "VariantName": "AllTraffic"}


def test_an_endpoint_imported_by_arn_keeps_that_arn(stack):
    arn = "arn:aws:sagemaker:us-east-2:444444444444:endpoint/peagle-prod"
    imported = PEagleComponentEndpoint.from_endpoint_arn(stack, "Prod", arn, variant_name="Blue")
    assert imported.endpoint_name == "peagle-prod"
    assert _grant_resource(stack, imported) == f'"{arn}"'
    assert imported.metric_model_latency().dimensions == {"EndpointName": "peagle-prod", "VariantName": "Blue"}


@pytest.mark.parametrize("name", ["-bad", "a" * 64, "has space"])
def test_an_imported_endpoint_name_is_checked(stack, name):
    with pytest.raises(ConfigError, match=r"^endpoint_name: got "):
        PEagleEndpoint.from_endpoint_name(stack, "Bad", name)


def test_an_arn_that_is_not_an_endpoints_is_refused(stack):
    with pytest.raises(ConfigError, match=r"^endpoint_arn: got 'arn:aws:sagemaker:us-east-1:444444444444:model/m'"):
        PEagleEndpoint.from_endpoint_arn(stack, "Bad", "arn:aws:sagemaker:us-east-1:444444444444:model/m")


def test_a_name_known_only_at_deploy_time_passes_to_cloudformation(stack):
    from aws_cdk import CfnParameter

    name = CfnParameter(stack, "EndpointName", type="String").value_as_string
    imported = PEagleEndpoint.from_endpoint_name(stack, "FromParameter", name)
    assert Token.is_unresolved(imported.endpoint_name)
    assert '"Ref": "EndpointName"' in _grant_resource(stack, imported)


def test_metric_methods_take_cdks_metric_options(stack):
    imported = PEagleEndpoint.from_endpoint_name(stack, "Shared", "shared")
    latency = imported.metric_model_latency(statistic="p50", period=Duration.minutes(1), label="p50 latency",
                                            unit=cloudwatch.Unit.MICROSECONDS, color="#ff0000")
    assert (latency.statistic, latency.period.to_seconds(), latency.label, latency.unit, latency.color) == (
        "p50", 60, "p50 latency", cloudwatch.Unit.MICROSECONDS, "#ff0000")
    assert imported.metric_invocations().period.to_seconds() == 300  # CDK's own default
    extra = imported.metric("OverheadLatency", dimensions_map={"Extra": "x"})
    assert extra.dimensions == {"EndpointName": "shared", "VariantName": "AllTraffic", "Extra": "x"}


def test_an_unknown_metric_option_names_the_ones_allowed(stack):
    imported = PEagleEndpoint.from_endpoint_name(stack, "Shared", "shared")
    with pytest.raises(ConfigError, match=r"^metric options: got \['stat'\] for Invocations; allowed: \[.*'statistic'"):
        imported.metric_invocations(stat="Sum")


def test_request_line_metrics_take_the_options_too(stack, serving, image):
    endpoint = PEagleEndpoint(stack, "Serving", model=ModelProps(serving=serving), image=image,
                              fleet=FleetProps(instance_type="ml.g6e.2xlarge"), endpoint_name="opts")
    ttft = endpoint.monitoring.metric_ttft(statistic="p99", label="TTFT p99")
    assert (ttft.statistic, ttft.label, ttft.unit) == ("p99", "TTFT p99", cloudwatch.Unit.MILLISECONDS)
    rate = endpoint.monitoring.metric_acceptance_rate(period=Duration.minutes(5), label="acceptance")
    assert (rate.period.to_seconds(), rate.label) == (300, "acceptance")
    with pytest.raises(ConfigError, match=r"^metric options: got \['statistic'\] for the acceptance rate"):
        endpoint.monitoring.metric_acceptance_rate(statistic="Sum")


def test_the_invoke_statement_is_the_grants_permission_for_a_managed_policy(stack):
    imported = PEagleEndpoint.from_endpoint_name(stack, "Shared", "shared")
    role = iam.Role(stack, "Caller", assumed_by=iam.AccountRootPrincipal())
    iam.ManagedPolicy(stack, "Invoke", roles=[role], statements=[imported.invoke_statement()])
    template = Template.from_stack(stack)
    assert not template.find_resources("AWS::IAM::Policy")  # nothing inline
    (policy,) = template.find_resources("AWS::IAM::ManagedPolicy").values()
    (statement,) = statements(policy)
    assert statement["Action"] == ["sagemaker:InvokeEndpoint", "sagemaker:InvokeEndpointWithResponseStream"]
    assert as_text(statement["Resource"]).endswith(':endpoint/shared"]]}')


def test_an_endpoint_named_by_a_parameter_passes_the_name_to_cloudformation(stack, serving, image):
    from aws_cdk import CfnParameter

    name = CfnParameter(stack, "EndpointName", type="String").value_as_string
    PEagleEndpoint(stack, "Serving", model=ModelProps(serving=serving), image=image,
                   fleet=FleetProps(instance_type="ml.g6e.xlarge"), endpoint_name=name)
    template = Template.from_stack(stack)
    (endpoint,) = template.find_resources("AWS::SageMaker::Endpoint").values()
    assert endpoint["Properties"]["EndpointName"] == {"Ref": "EndpointName"}
    (group,) = template.find_resources("AWS::Logs::LogGroup").values()
    assert group["Properties"]["LogGroupName"] == {"Fn::Join": ["", ["/aws/sagemaker/Endpoints/", {"Ref": "EndpointName"}]]}
