"""Fixtures of the policy tests: the S3-compatible server for checkpoints on object storage."""

from tests.s3_server import s3_bucket, s3_endpoint  # noqa: F401 - fixtures
