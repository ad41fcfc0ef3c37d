"""The LLM layer: one OpenAI-compatible endpoint (structured answers, retries, token costs) and a local llama.cpp
model for runs with no API key. The roles that write prompts for it live in ``search/roles/``."""
