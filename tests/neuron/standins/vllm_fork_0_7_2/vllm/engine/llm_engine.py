"""Stand-in of the fork's vllm/engine/llm_engine.py: the synchronous engine (`model_executor`)."""

from vllm.engine.async_llm_engine import LLMEngine

__all__ = ["LLMEngine"]
