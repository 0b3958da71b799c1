"""One Stage per environment, so `cdk deploy 'Dev/*'` deploys exactly one environment."""

from __future__ import annotations

from aws_cdk import Environment, Stage
from constructs import Construct

from peagle_constructs import ContainerImage

from stacks.environments import EnvironmentConfig
from stacks.serving_stack import PEagleStack


class PEagleStage(Stage):
    def __init__(self, scope: Construct, *, config: EnvironmentConfig, image: ContainerImage,
                 account: str, region: str, training_image: ContainerImage | None = None) -> None:
        super().__init__(scope, config.name, env=Environment(account=account, region=region))
        self.config = config
        self.stack = PEagleStack(self, config=config, image=image, training_image=training_image)
