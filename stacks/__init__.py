"""This organisation's P-EAGLE environments: typed configs, one Stage per environment, one stack each."""
