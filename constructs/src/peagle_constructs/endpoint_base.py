"""What every endpoint here is, built or imported: CDK's ``aws_sagemaker.IEndpoint``, with invoke grants and metrics.

:class:`EndpointBase` is what every endpoint here has - the ones this library creates and one deployed
elsewhere (another stack, another account) that :meth:`EndpointBase.from_endpoint_name` or
:meth:`EndpointBase.from_endpoint_arn` references. It implements aws-cdk-lib's own ``aws_sagemaker.IEndpoint``
(a ``Resource`` with ``endpoint_name``, ``endpoint_arn``, ``grant_invoke`` and ``env``), so whatever in CDK
takes an endpoint takes ours: ``aws_apigateway.SagemakerIntegration(endpoint)``, for one. An import by ARN
is in the ARN's account and region (``env``), as CDK's own imports are.
"""

from __future__ import annotations

from typing import Any, Mapping

import jsii
from aws_cdk import Arn, ArnFormat, Resource, Token
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sagemaker as sagemaker
from aws_cdk.interfaces import aws_sagemaker as sagemaker_refs
from constructs import Construct

from peagle_constructs.endpoint_names import check_endpoint_name, stack_endpoint_arn
from peagle_constructs.errors import ConfigError
from peagle_constructs.metrics import DEFAULT_METRIC_PERIOD, InvocationMetrics, metric
from peagle_constructs.sagemaker_names import DEFAULT_VARIANT_NAME, INVOCATION_METRICS_NAMESPACE

INVOKE_ACTIONS = ("sagemaker:InvokeEndpoint", "sagemaker:InvokeEndpointWithResponseStream")


@jsii.implements(sagemaker.IEndpoint)
class EndpointBase(InvocationMetrics, Resource):
    """A SageMaker real-time endpoint: ``endpoint_name``, ``endpoint_arn``, ``variant_name``, invoke grants and
    SageMaker's invocation metrics (namespace AWS/SageMaker, by endpoint and variant).

    ``endpoint_arn`` None: the endpoint is this stack's (its ARN in the stack's account and region);
    given: an endpoint imported by that ARN, whose ``env`` is the ARN's account and region.
    """

    def __init__(self, scope: Construct, id: str, *, endpoint_name: str, variant_name: str = DEFAULT_VARIANT_NAME,
                 endpoint_arn: str | None = None) -> None:
        super().__init__(scope, id, environment_from_arn=endpoint_arn)
        # Read through properties: JavaScript (jsii) reads IEndpoint's members only from properties.
        self._endpoint_name = endpoint_name
        self._variant_name = variant_name
        self._endpoint_arn = endpoint_arn if endpoint_arn is not None else stack_endpoint_arn(self, endpoint_name)

    @classmethod
    def from_endpoint_name(cls, scope: Construct, id: str, endpoint_name: str, *,
                           variant_name: str = DEFAULT_VARIANT_NAME) -> "EndpointBase":
        """An endpoint that exists already, in this stack's account and region."""
        return _ImportedEndpoint(scope, id, endpoint_name=check_endpoint_name(endpoint_name),
                                 variant_name=variant_name)

    @classmethod
    def from_endpoint_arn(cls, scope: Construct, id: str, endpoint_arn: str, *,
                          variant_name: str = DEFAULT_VARIANT_NAME) -> "EndpointBase":
        """An endpoint that exists already, by ARN (another account or region too).

        ARNs hold the name lower-cased, and CloudWatch's dimensions keep the name's own case: for an endpoint
        whose name has capitals, take :meth:`from_endpoint_name`, or the metrics will find nothing.
        """
        if not Token.is_unresolved(endpoint_arn):
            parts = str(endpoint_arn).split(":")
            if len(parts) != 6 or parts[0] != "arn" or parts[2] != "sagemaker" or not parts[5].startswith("endpoint/"):
                raise ConfigError("endpoint_arn", f"got {endpoint_arn!r}; allowed: "
                                  "'arn:<partition>:sagemaker:<region>:<account>:endpoint/<name>'")
        name = Arn.split(endpoint_arn, ArnFormat.SLASH_RESOURCE_NAME).resource_name
        return _ImportedEndpoint(scope, id, endpoint_name=name, variant_name=variant_name, endpoint_arn=endpoint_arn)

    # -- aws_sagemaker.IEndpoint ----------------------------------------------------------------------
    @property
    def endpoint_name(self) -> str:
        return self._endpoint_name

    @property
    def endpoint_arn(self) -> str:
        return self._endpoint_arn

    @property
    def endpoint_ref(self) -> sagemaker_refs.EndpointReference:
        return sagemaker_refs.EndpointReference(endpoint_arn=self.endpoint_arn)

    @property
    def variant_name(self) -> str:
        return self._variant_name

    def grant_invoke(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` call InvokeEndpoint and InvokeEndpointWithResponseStream on this endpoint only (CDK
        adds the statement to the grantee's default, inline, policy)."""
        return iam.Grant.add_to_principal(grantee=grantee, actions=list(INVOKE_ACTIONS),
                                          resource_arns=[self.endpoint_arn])

    def invoke_statement(self) -> iam.PolicyStatement:
        """The same permission as a statement, for a managed policy of your own (where a rule pack such as
        NIST 800-53 refuses inline policies)."""
        return iam.PolicyStatement(actions=list(INVOKE_ACTIONS), resources=[self.endpoint_arn])

    # -- SageMaker's invocation metrics of the variant ------------------------------------------------
    def _metric_defaults(self) -> dict[str, Any]:
        return {"period": DEFAULT_METRIC_PERIOD}

    def _metric_dimensions(self) -> dict[str, str]:
        return {"EndpointName": self.endpoint_name, "VariantName": self.variant_name}

    def metric(self, metric_name: str, **options: Any) -> cloudwatch.Metric:
        """Any metric SageMaker publishes in AWS/SageMaker for this variant (default statistic Average)."""
        return metric(INVOCATION_METRICS_NAMESPACE, metric_name, self._metric_dimensions(),
                      {"statistic": "Average", **self._metric_defaults()}, options)

    def _invocation_metric(self, metric_name: str, statistic: str, options: Mapping[str, Any]) -> cloudwatch.Metric:
        return self.metric(metric_name, **{"statistic": statistic, **options})


class _ImportedEndpoint(EndpointBase):
    """An endpoint this app references but does not create."""
