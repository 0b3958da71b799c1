"""The local stand-ins, and nothing else: what takes the place of AWS, SageMaker and GitHub on this machine.

- ``harness.aws``: an embedded AWS (moto's server plus the CloudFormation types and SageMaker APIs it lacks);
- ``harness.front_door``: SageMaker's runtime API on loopback, in front of the local runtime, for boto3;
- ``harness.runtime``: the serving runtime started as the image starts it, vLLM on the CPU;
- ``harness.client``: a streaming /invocations client, as SageMaker reaches the container, and the one
  stream parser every client shares;
- ``harness.serve`` / ``harness.invoke``: `make serve` / `make invoke`;
- ``harness.rehearsal``: the GitHub workflows as committed, on a real workflow engine (act), with GitHub's API
  and AWS stood in at the edge.

Each says what it cannot prove. What a user runs against a stage (deploy, smoke, load test, weights, the
live-config check) is in ops/, which uses these stand-ins for its local target. None of it ships: the
distributions under contract/, constructs/ and runtime/ never import it.
"""
