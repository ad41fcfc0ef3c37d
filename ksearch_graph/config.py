"""Search settings. Saved as ``run.json`` in the run directory so resume and branch use the same ones."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from .llm import LLMSettings
from .policy import PolicyName


class Budget(BaseModel):
    iterations: int = Field(20, ge=1, description="one codegen + one evaluation each")
    max_tokens: int | None = Field(None, ge=1, description="all roles together")
    max_cost_usd: float | None = Field(None, gt=0)
    max_wall_s: float | None = Field(None, gt=0, description="active search time, summed over resumes")


class SearchConfig(BaseModel):
    budget: Budget = Budget()
    parallel_cycles: int = Field(1, ge=1, le=16, description="k action cycles run side by side")
    # With k > 1: a cycle that ends is merged into the world model at once and its lane starts the next cycle, so
    # no GPU waits for the slowest cycle of a round. False: rounds of k cycles and one update after each round.
    rolling_cycles: bool = True
    samples: int = Field(1, ge=1, le=16, description="code generations per step, evaluated side by side; best kept")
    stagnation_window: int = Field(5, ge=1, description="W: a cycle ends after W non-improving attempts")
    difficulty_cap: int = Field(4, ge=1, le=5)
    policy: PolicyName = "greedy"
    # A new best must beat the old one by this relative margin; timings are noisy.
    noise_margin: float = Field(0.02, ge=0, le=1)
    # Re-measure a candidate that looks like a new global best and keep the lower score.
    confirm_new_best: bool = True
    # Ask a person (LangGraph interrupt) before each selected plan is implemented.
    approve_plans: bool = False
    max_edit_retries: int = Field(2, ge=0, le=5, description="re-asks when the planner's edit is rejected")
    eval_timeout_s: float = Field(180, gt=0)
    # Where candidates' code runs (harness/sandbox.py): bubblewrap, or "none" on a host without it (every result's
    # ``isolation`` says so). Kept with the run: a resume evaluates as the run began unless --sandbox says otherwise.
    sandbox: Literal["bwrap", "none"] = "bwrap"
    # Timing budget per workload (candidate and reference each). None: 1 s with a GPU; 0.25 s without,
    # where interpreter timings only rank candidates and the budget mostly costs wall time.
    timing_budget_s: float | None = Field(None, gt=0)
    world_model_render_chars: int = Field(6000, ge=500)
    planner: Literal["offline", "llm"] = "offline"
    planner_llm: LLMSettings | None = None
    coder_llm: LLMSettings | None = None
    seed: int = 0  # for the offline planner's tie-breaking and perturbations
