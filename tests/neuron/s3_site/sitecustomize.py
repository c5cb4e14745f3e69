"""Test-only: gives a node's processes an in-memory S3 (moto) seeded from a local checkpoint.

moto's standalone server needs Flask, which the test tools do not install; so each process that
puts this directory on PYTHONPATH starts moto itself and publishes STANDIN_S3_SEED_DIR to
STANDIN_S3_SEED_URI. Only the neuron node tests set these variables.
"""

import os

if os.environ.get("STANDIN_S3_SEED_DIR"):
    import boto3
    from moto import mock_aws

    from runtime.artifacts import parse_s3_uri, publish

    _mock = mock_aws()
    _mock.start()
    _uri = os.environ["STANDIN_S3_SEED_URI"]
    _client = boto3.client("s3", region_name="us-east-1")
    _client.create_bucket(Bucket=parse_s3_uri(_uri)[0])
    publish(os.environ["STANDIN_S3_SEED_DIR"], _uri, s3=_client)
    if os.environ.get("STANDIN_S3_TAMPER"):
        # A file replaced after publishing (a half-finished re-publish, an `aws s3 sync` over the set):
        # the bucket no longer holds what the manifest lists.
        _bucket, _prefix = parse_s3_uri(_uri)
        _client.put_object(Bucket=_bucket, Key=_prefix + os.environ["STANDIN_S3_TAMPER"], Body=b"replaced")
