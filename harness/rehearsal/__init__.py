"""`make rehearse`: the repository's GitHub workflows run as committed on a real workflow engine (act), on
this machine, from a fresh clone and fresh virtual environments, with stand-ins only at the edges.

- ``engine``: the scratch origin (HEAD, or the work tree), act's invocation on one workflow file with a token of
  the permissions it declares, and its JSON log read back;
- ``actions/``: the stand-ins for the marketplace actions the workflows use (checkout, setup-python,
  setup-node, upload- and download-artifact, configure-aws-credentials);
- ``github_api``: GitHub's REST API on loopback (``GITHUB_API_URL``): comments, labels, pull requests, commit
  statuses and a finished run's artifacts, each call allowed or refused by the token's permissions;
- ``aws_edge``: the embedded AWS accounts (one per stage), the SageMaker Runtime front door and log delivery;
  ``bin/docker``: the Docker CLI;
- ``scenarios``: what is rehearsed and how each outcome is judged.
"""
