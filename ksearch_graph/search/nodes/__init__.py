"""The graph's nodes, one module per phase. Each is a plain function ``(state, runtime) -> update``."""
