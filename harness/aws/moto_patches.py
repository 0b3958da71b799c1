"""Where moto's own CloudFormation models differ from AWS in ways that break our stacks, fixed in place.

1. Instance types. moto 5.2.5 checks an endpoint config's InstanceType against a list frozen years ago
   (g4dn, p3, inf1 ...): ml.g5 / ml.g6 / ml.g6e / ml.p4d / ml.p5 / ml.inf2 / ml.trn1 are refused, so no
   realistic LLM endpoint could be created. We accept those families with their real sizes on top of
   moto's list; anything else still goes to moto's check, so a typo keeps failing as on AWS.
2. Names. moto's CloudFormation ignores EndpointName / EndpointConfigName / ModelName and generates a
   name. AWS honours them, and our scaling target id, dashboards and the log group
   /aws/sagemaker/Endpoints/<name> are built from the endpoint's name, so we let moto honour them too.
3. KMS key tags. CloudFormation spells a tag {"Key", "Value"}; moto's KMS Key model hands the template's
   Tags straight to the KMS API code, which wants {"TagKey", "TagValue"}, and fails with KeyError: any
   tagged key (CDK's Tags.of(stage).add(...) tags every key) broke the stack.
4. Managed policies. moto's IAM ManagedPolicy has no CloudFormation delete: deleting a stack left the
   policy attached, so the role it was attached to could not be deleted either ("must detach all
   policies first") and the stack deletion failed. We detach it from every role, user and group and
   delete it, as CloudFormation does.
5. Endpoints for inference components. Such an endpoint's config names no model on its variant and
   carries an ExecutionRoleArn instead (AWS's scale-to-zero example passes one; we require it). moto reads variant["ModelName"] of
   every variant (KeyError) and drops ExecutionRoleArn; we check only the variants that name a model,
   require the role when one does not, and keep the role so describe_endpoint_config returns it.
6. Copy-count autoscaling. moto's Application Auto Scaling knows no
   sagemaker:inference-component:DesiredCopyCount dimension and refuses it (when registering a target and
   when describing one). We admit exactly that dimension, for the sagemaker namespace and a resource id
   inference-component/<name>; every other combination still goes to moto's checks.
7. Instance pools. moto refuses a production variant without InstanceType or ServerlessConfig; SageMaker takes
   InstancePools instead of InstanceType (a capacity fallback ladder). We check each pool's instance type as
   moto checks InstanceType; a variant with neither still fails.
8. SSM parameter tags. CloudFormation's AWS::SSM::Parameter spells Tags as a map (name: value), not a list;
   moto's model hands the map to its API code, which iterates {"Key", "Value"} items and fails with TypeError:
   any tagged parameter (a stage that trains publishes its candidate in one) broke the stack. We pass the
   list the API code reads.
"""

from __future__ import annotations

import re
from typing import Any

from moto.applicationautoscaling import models as aas_models
from moto.applicationautoscaling.exceptions import AWSValidationException
from moto.applicationautoscaling.responses import ApplicationAutoScalingResponse
from moto.iam.models import ManagedPolicy, iam_backends
from moto.kms.models import Key as KmsKey
from moto.sagemaker.exceptions import ValidationError
from moto.sagemaker.models import FakeEndpoint, FakeEndpointConfig, SageMakerModelBackend
from moto.sagemaker.models import Model as FakeModel
from moto.sagemaker.responses import SageMakerResponse
from moto.ssm.models import Parameter as SsmParameter

_SIZES = r"(?:large|xlarge|2xlarge|4xlarge|8xlarge|12xlarge|16xlarge|24xlarge|32xlarge|48xlarge)"
LLM_INSTANCE_TYPE = re.compile(
    rf"^ml\.(?:g5|g6|g6e|g7e|gr6|p4d|p4de|p5|p5e|p5en|p6-b200|inf2|trn1|trn1n|trn2|m6i|m7i|c6i|c7i|r6i|r7i)\.{_SIZES}$"
)

_moto_validate_instance_type = FakeEndpointConfig.validate_instance_type


def _validate_instance_type(self: FakeEndpointConfig, instance_type: str) -> None:
    if LLM_INSTANCE_TYPE.match(instance_type):
        return
    _moto_validate_instance_type(self, instance_type)


_moto_validate_production_variants = FakeEndpointConfig.validate_production_variants


def _validate_production_variants(self: FakeEndpointConfig, production_variants: list[dict[str, Any]]) -> None:
    plain = []
    for variant in production_variants:
        if "InstancePools" in variant and "InstanceType" not in variant:
            for pool in variant["InstancePools"]:
                self.validate_instance_type(pool["InstanceType"])
        else:
            plain.append(variant)
    _moto_validate_production_variants(self, plain)


_NAME_PROPERTY = {FakeEndpoint: "EndpointName", FakeEndpointConfig: "EndpointConfigName", FakeModel: "ModelName"}


_moto_create_kms_key = KmsKey.create_from_cloudformation_json.__func__  # type: ignore[attr-defined]


def _create_kms_key(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs):  # type: ignore[no-untyped-def]
    props = dict(cloudformation_json.get("Properties") or {})
    props["Tags"] = [{"TagKey": t["Key"], "TagValue": t["Value"]} if "Key" in t else t for t in props.get("Tags") or []]
    return _moto_create_kms_key(cls, resource_name, {**cloudformation_json, "Properties": props}, account_id,
                                region_name, **kwargs)


_moto_create_ssm_parameter = SsmParameter.create_from_cloudformation_json.__func__  # type: ignore[attr-defined]


def _create_ssm_parameter(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs):  # type: ignore[no-untyped-def]
    props = dict(cloudformation_json.get("Properties") or {})
    if isinstance(props.get("Tags"), dict):
        props["Tags"] = [{"Key": k, "Value": v} for k, v in props["Tags"].items()]
    return _moto_create_ssm_parameter(cls, resource_name, {**cloudformation_json, "Properties": props}, account_id,
                                      region_name, **kwargs)


def _delete_managed_policy(self: ManagedPolicy, account_id: str, region_name: str) -> None:
    backend = iam_backends[self.account_id][self.partition]
    for holders in (backend.roles.values(), backend.users.values(), backend.groups.values()):
        for holder in list(holders):
            if self.arn in holder.managed_policies:
                self.detach_from(holder)
    if self.arn in backend.managed_policies:
        backend.delete_policy(self.arn)


_moto_check_variant_models = SageMakerModelBackend.validate_production_variants
_moto_create_endpoint_config = FakeEndpointConfig.create_from_cloudformation_json.__func__  # type: ignore[attr-defined]
_moto_api_create_endpoint_config = SageMakerResponse.create_endpoint_config


def _check_variant_models(self: SageMakerModelBackend, production_variants: list[dict[str, Any]]) -> None:
    # A variant without ModelName is a fleet for inference components, not a typo: nothing to look up.
    _moto_check_variant_models(self, [v for v in production_variants if v.get("ModelName")])


def _require_role_for_components(config_name: str, variants: list[dict[str, Any]] | None, role_arn: str | None) -> None:
    modelless = [v.get("VariantName") for v in variants or [] if not v.get("ModelName")]
    if modelless and not role_arn:
        raise ValidationError(message=f"endpoint config {config_name!r}: variants {modelless} name no model (an "
                                      "endpoint for inference components), so ExecutionRoleArn is required")


def _create_endpoint_config(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs):  # type: ignore[no-untyped-def]
    props = cloudformation_json.get("Properties") or {}
    _require_role_for_components(resource_name, props.get("ProductionVariants"), props.get("ExecutionRoleArn"))
    config = _moto_create_endpoint_config(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs)
    config.execution_role_arn = props.get("ExecutionRoleArn")  # describe returns every attribute, CamelCased
    return config


def _api_create_endpoint_config(self: SageMakerResponse) -> Any:
    name, role_arn = self._get_param("EndpointConfigName"), self._get_param("ExecutionRoleArn")
    _require_role_for_components(name, self._get_param("ProductionVariants"), role_arn)
    result = _moto_api_create_endpoint_config(self)
    self.sagemaker_backend.endpoint_configs[name].execution_role_arn = role_arn
    return result


IC_DIMENSION = "sagemaker:inference-component:DesiredCopyCount"
_IC_RESOURCE_ID = re.compile(r"^inference-component/[a-zA-Z0-9](?:[-a-zA-Z0-9]*[a-zA-Z0-9])?$")
_moto_target_params_are_valid = aas_models._target_params_are_valid
_moto_validate_aas_params = ApplicationAutoScalingResponse._validate_params


def _target_params_are_valid(namespace: str, r_id: str, dimension: str) -> bool:
    if dimension != IC_DIMENSION:
        return _moto_target_params_are_valid(namespace, r_id, dimension)
    if namespace == "sagemaker" and _IC_RESOURCE_ID.match(r_id or ""):
        return True
    raise AWSValidationException(f"scalable dimension {IC_DIMENSION} needs service namespace sagemaker and a resource "
                                 f"id inference-component/<name>; got {namespace!r}, {r_id!r}")


def _validate_aas_params(self: ApplicationAutoScalingResponse) -> None:
    # moto's request check compares the dimension with its enum; the resource id is checked on register.
    if self._get_param("ScalableDimension") == IC_DIMENSION and self._get_param("ServiceNamespace") == "sagemaker":
        return
    _moto_validate_aas_params(self)


def install() -> None:
    """Idempotent. Call before moto's CloudFormation type caches are (re)built."""
    ManagedPolicy.delete = _delete_managed_policy  # type: ignore[attr-defined]
    KmsKey.create_from_cloudformation_json = classmethod(_create_kms_key)  # type: ignore[method-assign,assignment]
    SsmParameter.create_from_cloudformation_json = classmethod(_create_ssm_parameter)  # type: ignore[method-assign,assignment]
    FakeEndpointConfig.validate_instance_type = _validate_instance_type  # type: ignore[method-assign]
    FakeEndpointConfig.validate_production_variants = _validate_production_variants  # type: ignore[method-assign]
    SageMakerModelBackend.validate_production_variants = _check_variant_models  # type: ignore[method-assign]
    FakeEndpointConfig.create_from_cloudformation_json = classmethod(_create_endpoint_config)  # type: ignore[method-assign,assignment]
    SageMakerResponse.create_endpoint_config = _api_create_endpoint_config  # type: ignore[method-assign]
    # register_scalable_target looks the check up in its module at each call.
    aas_models._target_params_are_valid = _target_params_are_valid
    ApplicationAutoScalingResponse._validate_params = _validate_aas_params  # type: ignore[method-assign]
    for model, prop in _NAME_PROPERTY.items():
        # moto reads this staticmethod to find the property holding the physical name.
        model.cloudformation_name_type = staticmethod(lambda prop=prop: prop)  # type: ignore[method-assign]
