"""The dev harness: run the product on this machine, with nothing of AWS's and no GPU.

- ``harness.aws``: an embedded AWS (moto's server plus the CloudFormation types it lacks);
- ``harness.cdk``: the pinned CDK CLI, quietly, and the cloud assemblies it writes;
- ``harness.deploy``: `make deploy` / `make destroy` on the embedded AWS or a real account;
- ``harness.runtime``: the serving runtime started as the image starts it, vLLM on the CPU;
- ``harness.client`` / ``harness.spec_metrics``: a streaming /invocations client and vLLM's spec-decode counters;
- ``harness.serve`` / ``harness.invoke``: `make serve` / `make invoke`.

None of it ships: the distributions under contract/, constructs/ and runtime/ never import it.
"""
