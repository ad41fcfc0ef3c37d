"""The two roles the graph calls for judgement, a planner (edits the world model) and a coder (writes a kernel):
their interface (``protocol``), the offline no-LLM pair (``offline``, ``template``) and the LLM pair (``llm_roles``,
with its prompts in ``prompts/`` and their parts in ``prompt_parts``)."""
