"""flotilla operations: the `flotilla` CLI (status, topology, drain, replace, rollout, plan).

Imports boto3, rich and PyYAML only: never torch, runtime/ or aws_cdk, so an operator's laptop
can install it in seconds.
"""
