"""The search: the LangGraph graph and its nodes, the graph's state, the world model the planner edits, the rolling
lanes, the run's budgets and events, and the two roles (planner, coder) the nodes call (``roles/``)."""
