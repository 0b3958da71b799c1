#!/usr/bin/env python3
"""The CDK app: one Stage per environment (Dev, Staging, Prod), built from stacks/environments.py."""

from aws_cdk import App

from stacks.application import build_app, builtin_cloudformation_validation

# CDK's built-in template validation takes ~20 s of the synth here and only warns; cfn-lint checks every
# template in the tests instead. CDK_VALIDATION=true turns it back on.
app = App(builtin_cloud_formation_validation=builtin_cloudformation_validation())
build_app(app)
app.synth()
