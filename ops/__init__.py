"""Operations: what a user runs against a stage, on the embedded AWS (``--target local``) or in an account.

- ``ops.deploy``: `make deploy` / `make destroy`, then what exists against what the templates say
  (``ops.inventory``) and what the endpoint serves against what the stack deployed (``ops.live_config``);
- ``ops.smoke`` / ``ops.loadtest``: does the endpoint answer, and how fast, through the real boto3 client
  (``ops.sagemaker_client``);
- ``ops.stage_weights`` / ``ops.verify_bundle``: weights into a content-addressed S3 bundle, and the container's
  own check of it from an operator's machine;
- ``ops.prune``: the models and endpoint configs no endpoint uses any more;
- ``ops.capture_export``: a stage's traffic capture, out of its log group into a folder the drafter's trainer reads;
- ``ops.promotion``: what the promotion workflows read from the cloud assembly they deploy;
- ``ops.cdk``: the pinned CDK CLI, quietly (`make synth`), and the cloud assemblies it writes.

The GitHub workflows call these modules as they are; the local target starts the stand-ins of harness/.
"""
