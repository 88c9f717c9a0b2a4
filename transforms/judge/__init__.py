"""Async LLM-judge client: requests and responses, rate limits, and an OpenAI-compatible client (no Beam)."""
