"""The application: starting, resuming and branching a run (``runs``), campaigns, preflight, the settings a run
keeps, and the search as a LangGraph server app and as a part of larger agents. The CLI, the server and compose call
this layer."""
