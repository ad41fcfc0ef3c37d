"""ksearch_graph: K-Search (LLM kernel search with a co-evolving world model) as a LangGraph state machine."""

__version__ = "0.1.0"
