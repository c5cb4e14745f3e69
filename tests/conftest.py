"""Makes tests/ importable as a path root, so every suite shares tests/testnet.py."""

from s3_fixture import s3  # noqa: E402,F401 - registers the moto bucket fixture for every suite
