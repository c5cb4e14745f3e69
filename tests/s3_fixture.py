"""A moto S3 bucket for tests of model artifacts (runtime.artifacts) and of the neuron node's
start-up, which fetches them. tests/conftest.py registers the `s3` fixture for every suite."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

BUCKET = "flotilla-models"
URI = f"s3://{BUCKET}/llama/v1"


@pytest.fixture
def s3(monkeypatch):
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client
