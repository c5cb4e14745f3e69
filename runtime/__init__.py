"""flotilla's container runtime: unit members (leader/follower), the router, and the engines.

Nothing here imports aws-cdk-lib; the CDK app never imports this package.
"""
