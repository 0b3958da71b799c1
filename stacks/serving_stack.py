"""The one stack of every environment: a P-EAGLE endpoint with its monitoring."""

from __future__ import annotations

from dataclasses import replace

from aws_cdk import CfnOutput, DefaultStackSynthesizer, Stack, Tags
from aws_cdk import aws_kms as kms
from constructs import Construct

from peagle_constructs import (
    CaptureDelivery, ContainerImage, CopyScaling, DrafterTraining, PEagleComponentEndpoint, PEagleEndpoint,
    PEagleInferenceComponent,
)
from peagle_constructs.weights import WeightsLayout

from stacks.deploy_permissions import apply_to_stage
from stacks.environments import ComponentHosting, EnvironmentConfig
from stacks.release import IMAGE_TAG_PREFIX, VERSION

VERSION_VAR = "PEAGLE_VERSION"
# The commit a pipeline deploys (`-c gitRevision=$GITHUB_SHA`); unset locally, so a local synth and the
# offline pull-request diff do not change with every commit.
GIT_REVISION_CONTEXT = "gitRevision"

STACK_ID = "PEagle"
ENDPOINT_ID = "Serving"
COMPONENT_ID = "Model"


def stage_stack_name(stage: str) -> str:
    """The CloudFormation stack name CDK gives this stack in the Stage ``stage`` (``<stage>-<id>``)."""
    return f"{stage}-{STACK_ID}"


def when_idle(scaling: CopyScaling) -> str:
    """What a user of a scale-to-zero environment meets and pays, printed by `cdk deploy` as an output. SageMaker
    creates a component with one copy, so every deploy bills an instance until the copies' scale-in cooldown."""
    minutes = int(scaling.scale_in_cooldown.to_seconds() // 60)
    return (f"the component is created with one copy and scales in to none by itself {minutes} min after its last "
            "request, and the fleet then releases its instance: an instance is billed from each deploy or wake-up "
            "until then; while idle, the first request fails at once (ValidationError: Inference Component has no "
            "capacity to process this request) and wakes the endpoint; retry - a copy serves after about 10-15 "
            "minutes (an instance starts, the model loads)")


class PEagleStack(Stack):
    def __init__(self, scope: Construct, id: str = STACK_ID, *, config: EnvironmentConfig, image: ContainerImage,
                 training_image: ContainerImage | None = None,
                 **kwargs) -> None:  # noqa: ANN003 - StackProps (env, synthesizer, ...)
        super().__init__(
            scope, id,
            description=f"P-EAGLE (vLLM parallel speculative decoding) on SageMaker: {config.name}",
            synthesizer=DefaultStackSynthesizer(docker_tag_prefix=IMAGE_TAG_PREFIX),
            **kwargs,
        )
        self.config = config
        # The release in the model's environment: a new release is a new model (as its image is). The git
        # revision is an output only: in the model it would replace the endpoint's model on every commit.
        model = replace(config.model, environment={**config.model.environment, VERSION_VAR: VERSION})
        weights_key = kms.Key.from_key_arn(self, "WeightsKey", config.weights_key_arn) if config.weights_key_arn else None
        hosting = config.hosting
        self.component: PEagleInferenceComponent | None = None
        if isinstance(hosting, ComponentHosting):
            self.endpoint = PEagleComponentEndpoint(
                self, ENDPOINT_ID, fleet=config.fleet, instance_scaling=hosting.instance_scaling,
                allow_scale_to_zero=hosting.allow_scale_to_zero, endpoint_name=config.endpoint_name)
            self.component = self.endpoint.add_component(
                COMPONENT_ID, model=model, image=image, component_name=config.component_name,
                copy_count=hosting.copy_count, compute=hosting.compute, scaling=hosting.scaling,
                deployment=hosting.deployment, weights_key=weights_key)
        else:
            self.endpoint = PEagleEndpoint(
                self, ENDPOINT_ID, model=model, image=image, fleet=config.fleet, endpoint_name=config.endpoint_name,
                scaling=hosting.scaling, deployment=hosting.deployment, weights_key=weights_key)
        revision = self.node.try_get_context(GIT_REVISION_CONTEXT) or "unset"
        CfnOutput(self, "Version", value=VERSION, description="the release of this project that built the stack")
        CfnOutput(self, "GitRevision", value=str(revision), description="the commit the pipeline deployed")
        CfnOutput(self, "EndpointName", value=self.endpoint.endpoint_name, description="the SageMaker endpoint")
        if self.component is not None:
            CfnOutput(self, "InferenceComponentName", value=self.component.component_name,
                      description="name it in every request (InferenceComponentName)")
            if hosting.scaling.min_copies == 0:
                CfnOutput(self, "WhenIdle", value=when_idle(hosting.scaling),
                          description="what scale-to-zero bills, and the first request after a quiet spell")
        capture = (self.component or self.endpoint).monitoring.capture
        if capture is not None:
            # A name the execution policy can scope the bucket's deploy to (the construct leaves it to CloudFormation).
            capture.bucket.node.default_child.bucket_name = config.capture_bucket_name(self.account, self.region)
            CfnOutput(self, "CaptureUri", value=capture.capture_uri,
                      description="the stage's capture records, for make train-drafter CAPTURE=")
        self.training: DrafterTraining | None = None
        if config.training is not None:
            self.training = self._drafter_training(config, capture, training_image, weights_key)
        for key, value in config.tags.items():
            Tags.of(self).add(key, value)
        # Every role this stage creates lives under its IAM path and carries its account's workload boundary: what
        # the scoped CloudFormation execution policy requires (stacks.deploy_permissions).
        apply_to_stage(self, config)

    def _drafter_training(self, config: EnvironmentConfig, capture: CaptureDelivery,
                          training_image: ContainerImage | None, weights_key: kms.IKey | None) -> DrafterTraining:
        """The stage's drafter training: its own capture in, from the bundle it serves (EnvironmentConfig refuses
        training without capture or a pin), at the K it serves."""
        if training_image is None:
            raise ValueError(f"{config.name}.training is set but no training image was given to the stack")
        serving = config.model.serving
        training = DrafterTraining(
            self, "DrafterTraining", image=training_image, stage=config.name.lower(),
            key=(self.component or self.endpoint).monitoring.key, capture=capture,
            bundle=WeightsLayout.of(serving).source.uri,
            bundle_sha256=serving.bundle_manifest_sha256, target_name=serving.capture.target,
            k=serving.num_speculative_tokens, props=config.training, weights_account=config.model.weights_account,
            weights_key=weights_key)
        CfnOutput(self, "DrafterTrainingStateMachine", value=training.state_machine_arn,
                  description="aws stepfunctions start-execution --state-machine-arn <this>: train the next drafter")
        CfnOutput(self, "DrafterCandidateParameter", value=training.parameter_name,
                  description="the last candidate that passed its gate: its pin and figures (aws ssm get-parameter)")
        return training
