"""Makes tests/ importable as a path root, so every suite shares tests/testnet.py."""
