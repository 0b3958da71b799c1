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
"""

from __future__ import annotations

import re

from moto.iam.models import ManagedPolicy, iam_backends
from moto.kms.models import Key as KmsKey
from moto.sagemaker.models import FakeEndpoint, FakeEndpointConfig
from moto.sagemaker.models import Model as FakeModel

_SIZES = r"(?:large|xlarge|2xlarge|4xlarge|8xlarge|12xlarge|16xlarge|24xlarge|32xlarge|48xlarge)"
LLM_INSTANCE_TYPE = re.compile(
    rf"^ml\.(?:g5|g6|g6e|g7e|gr6|p4d|p4de|p5|p5e|p5en|p6-b200|inf2|trn1|trn1n|trn2|m6i|m7i|c6i|c7i|r6i|r7i)\.{_SIZES}$"
)

_moto_validate_instance_type = FakeEndpointConfig.validate_instance_type


def _validate_instance_type(self: FakeEndpointConfig, instance_type: str) -> None:
    if LLM_INSTANCE_TYPE.match(instance_type):
        return
    _moto_validate_instance_type(self, instance_type)


_NAME_PROPERTY = {FakeEndpoint: "EndpointName", FakeEndpointConfig: "EndpointConfigName", FakeModel: "ModelName"}


_moto_create_kms_key = KmsKey.create_from_cloudformation_json.__func__  # type: ignore[attr-defined]


def _create_kms_key(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs):  # type: ignore[no-untyped-def]
    props = dict(cloudformation_json.get("Properties") or {})
    props["Tags"] = [{"TagKey": t["Key"], "TagValue": t["Value"]} if "Key" in t else t for t in props.get("Tags") or []]
    return _moto_create_kms_key(cls, resource_name, {**cloudformation_json, "Properties": props}, account_id,
                                region_name, **kwargs)


def _delete_managed_policy(self: ManagedPolicy, account_id: str, region_name: str) -> None:
    backend = iam_backends[self.account_id][self.partition]
    for holders in (backend.roles.values(), backend.users.values(), backend.groups.values()):
        for holder in list(holders):
            if self.arn in holder.managed_policies:
                self.detach_from(holder)
    if self.arn in backend.managed_policies:
        backend.delete_policy(self.arn)


def install() -> None:
    """Idempotent. Call before moto's CloudFormation type caches are (re)built."""
    ManagedPolicy.delete = _delete_managed_policy  # type: ignore[attr-defined]
    KmsKey.create_from_cloudformation_json = classmethod(_create_kms_key)  # type: ignore[method-assign,assignment]
    FakeEndpointConfig.validate_instance_type = _validate_instance_type  # type: ignore[method-assign]
    for model, prop in _NAME_PROPERTY.items():
        # moto reads this staticmethod to find the property holding the physical name.
        model.cloudformation_name_type = staticmethod(lambda prop=prop: prop)  # type: ignore[method-assign]
