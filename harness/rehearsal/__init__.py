"""`make rehearse`: the repository's GitHub workflows run as committed on a real workflow engine (act), on
this machine, from a fresh clone and fresh virtual environments, with stand-ins only at the edges.

- ``engine``: the scratch origin, act's invocation and its JSON log read back;
- ``actions/``: the stand-ins for the marketplace actions the workflows use (checkout, setup-python,
  setup-node, upload- and download-artifact, configure-aws-credentials);
- ``github_api``: GitHub's REST API for comments and labels, on loopback (``GITHUB_API_URL``);
- ``aws_edge``: the embedded AWS account, the SageMaker Runtime front door and log delivery; ``bin/docker``:
  the Docker CLI;
- ``scenarios``: what is rehearsed and how each outcome is judged.
"""
