"""Wiring: the main search graph and the action-cycle subgraph.

    START -> init_world_model -> select_plans --Send x k--> action_cycle -> update_world_model -> select_plans
                                      \\-> finalize -> END
    action_cycle:  START -> instantiate_code -> compile_and_bench -> reflect --continue--> instantiate_code
                                                                          \\--close--> END
                   (rolling lanes, k > 1:  reflect --close--> next_cycle --next--> instantiate_code
                                                                          \\--lane done--> END;
                    a lane launched without a free action starts at next_cycle, waiting for one)

One node per phase, so every phase boundary is a checkpoint (and a point to branch from). The
subgraph is compiled without a checkpointer: it inherits the parent's, and its own steps are
checkpointed under its task's namespace, so a crash mid-cycle resumes mid-cycle.
"""

from __future__ import annotations

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph

from ksearch_graph.search.context import SearchContext
from ksearch_graph.search.nodes.compile_and_bench import compile_and_bench
from ksearch_graph.search.nodes.finalize import finalize
from ksearch_graph.search.nodes.instantiate_code import instantiate_code
from ksearch_graph.search.nodes.next_cycle import after_next_cycle, lane_start, next_cycle
from ksearch_graph.search.nodes.reflect import continue_or_close, reflect
from ksearch_graph.search.nodes.select_plans import launch_cycles, select_plans
from ksearch_graph.search.nodes.world_model_update import init_world_model, update_world_model
from ksearch_graph.search.rolling import lane
from ksearch_graph.search.state import CycleState, SearchState


def build_cycle_graph(context_schema: type = SearchContext):
    g = StateGraph(CycleState, context_schema=context_schema)
    g.add_node("instantiate_code", instantiate_code)
    g.add_node("compile_and_bench", compile_and_bench)
    g.add_node("reflect", reflect)
    g.add_node("next_cycle", next_cycle)
    g.add_conditional_edges(START, lane_start, ["instantiate_code", "next_cycle"])
    g.add_edge("instantiate_code", "compile_and_bench")
    g.add_edge("compile_and_bench", "reflect")
    g.add_conditional_edges("reflect", continue_or_close, ["instantiate_code", "next_cycle", END])
    g.add_conditional_edges("next_cycle", after_next_cycle, ["instantiate_code", END])
    return g.compile()


def build_search_graph(checkpointer: BaseCheckpointSaver | None = None, context_schema: type = SearchContext):
    """The K-Search graph. Pass a checkpointer for the CLI; servers supply their own (``server.py``)."""
    g = StateGraph(SearchState, context_schema=context_schema)
    g.add_node("init_world_model", init_world_model)
    g.add_node("select_plans", select_plans)
    # Each cycle runs as a lane (rolling.lane): a lane that fails wakes the lanes waiting for its merge.
    g.add_node("action_cycle", lane(build_cycle_graph(context_schema)))
    g.add_node("update_world_model", update_world_model)
    g.add_node("finalize", finalize)
    g.add_edge(START, "init_world_model")
    g.add_edge("init_world_model", "select_plans")
    g.add_conditional_edges("select_plans", launch_cycles, ["action_cycle", "finalize"])
    g.add_edge("action_cycle", "update_world_model")
    g.add_edge("update_world_model", "select_plans")
    g.add_edge("finalize", END)
    return g.compile(checkpointer=checkpointer)
