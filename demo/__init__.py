"""The demo: the whole product on this machine in one command (`make demo`, `python -m demo`)."""
