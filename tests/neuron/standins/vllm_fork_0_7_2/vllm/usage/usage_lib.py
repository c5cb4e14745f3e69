"""Stand-in of the fork's vllm/usage/usage_lib.py: UsageContext only."""

import enum


class UsageContext(str, enum.Enum):
    UNKNOWN_CONTEXT = "UNKNOWN_CONTEXT"
    LLM_CLASS = "LLM_CLASS"
    API_SERVER = "API_SERVER"
    OPENAI_API_SERVER = "OPENAI_API_SERVER"
