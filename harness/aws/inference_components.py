"""SageMaker inference components, which moto 5.2.5 lacks entirely: a store of our own and the service API on it.

An inference component (IC) places one model, with its accelerator / memory / CPU share and a copy count, on
a variant of an endpoint whose config names no model. moto has no notion of it: no backend, no API action,
no CloudFormation type. This module holds:

- the store (``inference_component_backends``), a moto ``BackendDict``, so ``mock_aws()`` and moto_server's
  reset clear it together with moto's own state;
- the refusals the real service makes on create: an unknown endpoint, a variant not on it, a variant that
  already serves a model, an unknown model (each message names what is missing);
- the API actions (Create/Describe/List/DeleteInferenceComponent), added to moto's ``SageMakerResponse``,
  answering in botocore's own output shapes;
- one change to moto's endpoint deletion: an endpoint that still hosts components is not deleted (see
  ``_delete_endpoint``), which is what makes moto's stack deletion take the components first.

The CloudFormation type (AWS::SageMaker::InferenceComponent) is ``cfn_types.InferenceComponent``, on this store.
"""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from moto.core.base_backend import BackendDict, BaseBackend
from moto.core.responses import ActionResult, EmptyResult
from moto.core.utils import utcnow
from moto.sagemaker.exceptions import ValidationError
from moto.sagemaker.models import FakeEndpoint, SageMakerModelBackend, sagemaker_backends
from moto.sagemaker.responses import SageMakerResponse
from moto.sagemaker.utils import arn_formatter

# The API's constraint on InferenceComponentName: at most 63 letters, digits and hyphens, no hyphen at either end.
_NAME = re.compile(r"^[a-zA-Z0-9](?:[-a-zA-Z0-9]*[a-zA-Z0-9])?$")
STATUS = "InService"  # created at once, as moto does for endpoints


@functools.lru_cache(maxsize=1)
def _service_model() -> Any:
    import botocore.session

    return botocore.session.get_session().get_service_model("sagemaker")


def _conform(value: Any, shape: Any, where: str) -> Any:
    """``value`` checked against a botocore shape: unknown or missing members refused, scalars given their type.

    CloudFormation hands us the template's values as written (a number may be the string "1"), and the
    resource schema has additionalProperties false: a misspelt property must fail here as it does on AWS,
    not vanish.
    """
    kind = shape.type_name
    if kind == "structure":
        if not isinstance(value, dict):
            raise ValidationError(message=f"{where}: expected an object ({shape.name}), got {value!r}")
        unknown = sorted(set(value) - set(shape.members))
        if unknown:
            raise ValidationError(message=f"{where}: unknown properties {unknown}; {shape.name} has {sorted(shape.members)}")
        missing = [m for m in shape.required_members if m not in value]
        if missing:
            raise ValidationError(message=f"{where}: missing required {missing}")
        return {k: _conform(v, shape.members[k], f"{where}.{k}") for k, v in value.items()}
    if kind == "list":
        if not isinstance(value, list):
            raise ValidationError(message=f"{where}: expected a list, got {value!r}")
        return [_conform(v, shape.member, f"{where}[{i}]") for i, v in enumerate(value)]
    try:
        if kind in ("integer", "long"):
            return int(value)
        if kind in ("float", "double"):
            return float(value)
    except (TypeError, ValueError):
        raise ValidationError(message=f"{where}: expected a number, got {value!r}") from None
    if kind == "boolean" and not isinstance(value, bool):
        return str(value).lower() == "true"
    return value


def _conform_to(value: Any, shape_name: str, where: str) -> Any:
    return None if value is None else _conform(value, _service_model().shape_for(shape_name), where)


@dataclass
class InferenceComponentRecord:
    name: str
    arn: str
    endpoint_name: str
    endpoint_arn: str
    variant_name: str
    specification: dict[str, Any]
    copy_count: int
    deployment_config: dict[str, Any] | None = None
    tags: list[dict[str, str]] = field(default_factory=list)
    status: str = STATUS
    creation_time: datetime = field(default_factory=utcnow)
    last_modified_time: datetime = field(default_factory=utcnow)

    def describe(self) -> dict[str, Any]:
        """DescribeInferenceComponentOutput. Describe reports the image as DeployedImage, not as the Image sent."""
        spec = copy.deepcopy(self.specification)
        container = spec.get("Container") or {}
        if "Image" in container:
            image = container.pop("Image")
            container["DeployedImage"] = {"SpecifiedImage": image, "ResolvedImage": image,
                                          "ResolutionTime": self.creation_time}
        out = {
            "InferenceComponentName": self.name, "InferenceComponentArn": self.arn,
            "EndpointName": self.endpoint_name, "EndpointArn": self.endpoint_arn, "VariantName": self.variant_name,
            "Specification": spec,
            # Nothing scales here: what was asked for is what runs.
            "RuntimeConfig": {"DesiredCopyCount": self.copy_count, "CurrentCopyCount": self.copy_count},
            "CreationTime": self.creation_time, "LastModifiedTime": self.last_modified_time,
            "InferenceComponentStatus": self.status,
        }
        if self.deployment_config:
            out["LastDeploymentConfig"] = self.deployment_config
        return out

    def summary(self) -> dict[str, Any]:
        """InferenceComponentSummary (one entry of ListInferenceComponents)."""
        return {k: v for k, v in self.describe().items() if k in {
            "InferenceComponentName", "InferenceComponentArn", "EndpointName", "EndpointArn", "VariantName",
            "CreationTime", "LastModifiedTime", "InferenceComponentStatus"}}


class InferenceComponentBackend(BaseBackend):
    """The inference components of one account and region, by name."""

    def __init__(self, region_name: str, account_id: str) -> None:
        super().__init__(region_name, account_id)
        self.components: dict[str, InferenceComponentRecord] = {}

    @property
    def _sagemaker(self) -> SageMakerModelBackend:
        return sagemaker_backends[self.account_id][self.region_name]

    def arn(self, name: str) -> str:
        return arn_formatter("inference-component", name, self.account_id, self.region_name)

    def create(self, *, name: str, endpoint_name: str, variant_name: str | None, specification: Any,
               runtime_config: Any, deployment_config: Any = None, specifications: Any = None,
               tags: list[dict[str, str]] | None = None) -> InferenceComponentRecord:
        where = f"inference component {name!r}"
        if not isinstance(name, str) or len(name) > 63 or not _NAME.match(name):
            raise ValidationError(message=f"{where}: a name is 1-63 letters, digits and inner hyphens")
        if name in self.components:
            raise ValidationError(message=f"{where} already exists ({self.arn(name)})")
        if specifications is not None:
            # Per-instance-type specifications (heterogeneous instance pools) are not modelled here.
            raise ValidationError(message=f"{where}: Specifications (per instance type) is not supported by the "
                                          "embedded AWS; use Specification")
        if specification is None:
            raise ValidationError(message=f"{where}: Specification is required")
        spec = _conform_to(specification, "InferenceComponentSpecification", f"{where}: Specification")
        runtime = _conform_to(runtime_config, "InferenceComponentRuntimeConfig", f"{where}: RuntimeConfig")
        if runtime is None:
            raise ValidationError(message=f"{where}: RuntimeConfig {{CopyCount}} is required")
        if runtime.get("CopyCount") == 0:
            # The service's refusal: a component starts with a copy; only its autoscaling takes it to zero.
            raise ValidationError(message=f"{where}: CopyCount 0 at creation; an inference component is created "
                                          "with at least one copy and scales in to zero afterwards")
        deployment = _conform_to(deployment_config, "InferenceComponentDeploymentConfig", f"{where}: DeploymentConfig")

        endpoint = self._sagemaker.endpoints.get(endpoint_name)
        if endpoint is None:
            raise ValidationError(message=f"{where}: could not find endpoint {endpoint_name!r} "
                                          f"({FakeEndpoint.arn_formatter(endpoint_name, self.account_id, self.region_name)})")
        variant_name = variant_name or self._only_variant(endpoint, where)
        variant = self._variant(endpoint, variant_name, where)
        if variant.get("ModelName"):
            # The real service's refusal: an endpoint whose variant serves a model cannot host components.
            raise ValidationError(message=f"{where}: variant {variant_name!r} of endpoint {endpoint_name!r} serves "
                                          f"model {variant['ModelName']!r}; inference components need a variant with no ModelName")
        model_name = spec.get("ModelName")
        if model_name is not None and model_name not in self._sagemaker._models:
            raise ValidationError(message=f"{where}: could not find model {model_name!r} "
                                          f"({arn_formatter('model', model_name, self.account_id, self.region_name)})")
        if model_name is None and not (spec.get("Container") or {}).get("Image") and not spec.get("BaseInferenceComponentName"):
            raise ValidationError(message=f"{where}: Specification names no ModelName, Container.Image or "
                                          "BaseInferenceComponentName: nothing to deploy")

        component = InferenceComponentRecord(
            name=name, arn=self.arn(name), endpoint_name=endpoint_name, endpoint_arn=endpoint.arn,
            variant_name=variant_name, specification=spec, copy_count=runtime["CopyCount"],
            deployment_config=deployment, tags=list(tags or []))
        self.components[name] = component
        return component

    @staticmethod
    def _only_variant(endpoint: FakeEndpoint, where: str) -> str:
        names = [v["VariantName"] for v in endpoint.production_variants]
        if len(names) != 1:
            raise ValidationError(message=f"{where}: endpoint {endpoint.endpoint_name!r} has variants {names}; "
                                          "name one (VariantName)")
        return names[0]

    def _variant(self, endpoint: FakeEndpoint, variant_name: str, where: str) -> dict[str, Any]:
        names = [v["VariantName"] for v in endpoint.production_variants]
        if variant_name not in names:
            raise ValidationError(message=f"{where}: endpoint {endpoint.endpoint_name!r} has no variant "
                                          f"{variant_name!r} (it has {names})")
        # The endpoint keeps only counts and weights per variant; whether a model is named is in its config.
        config = self._sagemaker.endpoint_configs.get(endpoint.endpoint_config_name)
        for variant in (config.production_variants if config else []):
            if variant.get("VariantName") == variant_name:
                return variant
        return {"VariantName": variant_name}

    def get(self, name: str) -> InferenceComponentRecord:
        try:
            return self.components[name]
        except KeyError:
            raise ValidationError(message=f"Could not find inference component '{self.arn(name)}'.") from None

    def list(self, *, endpoint_name: str | None = None, variant_name: str | None = None, status: str | None = None,
             name_contains: str | None = None) -> list[InferenceComponentRecord]:
        return [c for c in self.components.values()
                if (endpoint_name is None or c.endpoint_name == endpoint_name)
                and (variant_name is None or c.variant_name == variant_name)
                and (status is None or c.status == status)
                and (name_contains is None or name_contains.lower() in c.name.lower())]

    def delete(self, name: str) -> None:
        self.get(name)
        del self.components[name]


inference_component_backends: BackendDict[InferenceComponentBackend] = BackendDict(
    InferenceComponentBackend, "sagemaker")


def name_from_arn(arn: str) -> str:
    return arn.rsplit("/", 1)[-1]


# The API actions. moto dispatches a JSON action to the SageMakerResponse method of its snake_case name.

def _components(response: SageMakerResponse) -> InferenceComponentBackend:
    return inference_component_backends[response.current_account][response.region]


def create_inference_component(self: SageMakerResponse) -> ActionResult:
    component = _components(self).create(
        name=self._get_param("InferenceComponentName"), endpoint_name=self._get_param("EndpointName"),
        variant_name=self._get_param("VariantName"), specification=self._get_param("Specification"),
        specifications=self._get_param("Specifications"), runtime_config=self._get_param("RuntimeConfig"),
        tags=self._get_param("Tags"))
    return ActionResult({"InferenceComponentArn": component.arn})


def describe_inference_component(self: SageMakerResponse) -> ActionResult:
    return ActionResult(_components(self).get(self._get_param("InferenceComponentName")).describe())


_SORT_KEYS = {"CreationTime": lambda c: c.creation_time, "Name": lambda c: c.name, "Status": lambda c: c.status}


def list_inference_components(self: SageMakerResponse) -> ActionResult:
    found = _components(self).list(
        endpoint_name=self._get_param("EndpointNameEquals"), variant_name=self._get_param("VariantNameEquals"),
        status=self._get_param("StatusEquals"), name_contains=self._get_param("NameContains"))
    found.sort(key=_SORT_KEYS[self._get_param("SortBy") or "CreationTime"],
               reverse=(self._get_param("SortOrder") or "Descending") == "Descending")
    start = int(self._get_param("NextToken") or 0)
    size = int(self._get_param("MaxResults") or 10)
    page = found[start:start + size]
    out: dict[str, Any] = {"InferenceComponents": [c.summary() for c in page]}
    if start + size < len(found):
        out["NextToken"] = str(start + size)
    return ActionResult(out)


def delete_inference_component(self: SageMakerResponse) -> EmptyResult:
    _components(self).delete(self._get_param("InferenceComponentName"))
    return EmptyResult()


_API = (create_inference_component, describe_inference_component, list_inference_components,
        delete_inference_component)

_moto_delete_endpoint = SageMakerModelBackend.delete_endpoint


def _delete_endpoint(self: SageMakerModelBackend, endpoint_name: str) -> None:
    # Components live on the endpoint's instances; deleting it under them would leave them orphaned in our
    # store. The console deletes an endpoint's components first; we refuse instead, so that the caller (and
    # moto's stack deletion, which retries a failed resource in its next pass) deletes them first.
    hosted = inference_component_backends[self.account_id][self.region_name].list(endpoint_name=endpoint_name)
    if hosted:
        raise ValidationError(message=f"Endpoint {endpoint_name!r} still hosts inference components "
                                      f"{sorted(c.name for c in hosted)}: delete them first")
    _moto_delete_endpoint(self, endpoint_name)


def install() -> None:
    """Idempotent: add the API actions to moto's SageMaker responses and guard endpoint deletion."""
    for action in _API:
        setattr(SageMakerResponse, action.__name__, action)
    SageMakerModelBackend.delete_endpoint = _delete_endpoint  # type: ignore[method-assign]
