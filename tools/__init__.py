"""Developer tooling run by the Makefile: local deploy, stack diffs, local serving, the demo."""
