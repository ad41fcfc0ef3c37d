"""A small coding agent that writes a PyTorch op as a kernel task, optimises it with K-Search, and reports.

    python examples/kernel_agent/agent.py --model MODEL [--base-url URL] "a fused GELU(x) * y for [4096, 4096] fp32"

The agent is LangChain's `create_agent` (a ReAct loop on LangGraph) with two tools: `write_kernel_task` (turns the op it wrote
into a task folder: reference, input generator, workloads) and K-Search's `optimize_kernel` tool. The same
endpoint serves the agent and the search's planner and coder.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from langchain.agents import create_agent
from langchain_core.tools import tool

from ksearch_graph.app.compose import optimize_kernel

WORKDIR = Path("runs") / "kernel_agent"

SYSTEM = """You are a kernel engineer. For the user's operation:
1. Write it in plain PyTorch and call write_kernel_task with a name, a short spec, and `reference_code`: a
   Python module defining `make_inputs(params, seed, device)` (returns a tuple of tensors, seeded with a
   torch.Generator) and `reference(*inputs)`, plus 2-4 workloads ({"name": ..., "params": {...}}).
2. Call optimize_kernel on the task folder it returns, with a run_dir under runs/kernel_agent/.
3. Report the best score (speed-up over your PyTorch version), latency and where the kernel is."""


@tool
def write_kernel_task(name: str, spec: str, reference_code: str, workloads: list[dict], entry_point: str = "kernel") -> str:
    """Create a K-Search task folder for a PyTorch operation; returns the folder path.

    `reference_code` must define make_inputs(params, seed, device) and reference(*inputs). Candidates
    are Python modules defining `entry_point` with the same signature as `reference`. The reference also
    serves as the seed solution the search starts from.
    """
    folder = WORKDIR / "tasks" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spec.md").write_text(spec)
    (folder / "reference.py").write_text(reference_code)
    (folder / "seed.py").write_text(reference_code + f"\n\n{entry_point} = reference\n")
    (folder / "task.json").write_text(json.dumps({
        "name": name, "description": spec.splitlines()[0] if spec else name, "language": "pytorch",
        "entry_point": entry_point, "solution_file": "kernel.py", "seed_solution": "seed.py",
        "tolerance": {"atol": 1e-4, "rtol": 1e-4}, "workloads": workloads,
    }, indent=2))
    from ksearch_graph.tasks.task import load_task

    load_task(folder)  # a malformed task is the agent's error to fix, reported back as the tool's error
    return str(folder)


def make_agent(model):
    return create_agent(model, [write_kernel_task, optimize_kernel], system_prompt=SYSTEM)


def main() -> None:
    from langchain_openai import ChatOpenAI

    ap = argparse.ArgumentParser()
    ap.add_argument("request")
    ap.add_argument("--model", required=True)
    ap.add_argument("--base-url")
    args = ap.parse_args()
    agent = make_agent(ChatOpenAI(model=args.model, base_url=args.base_url))
    request = f"{args.request}\n(optimize_kernel: model={args.model!r}, base_url={args.base_url!r})"
    for step in agent.stream({"messages": [("user", request)]}, stream_mode="values"):
        step["messages"][-1].pretty_print()


if __name__ == "__main__":
    main()
