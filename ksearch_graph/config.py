"""Search settings, the LLM endpoints' included. Saved as ``run.json`` in the run directory so resume and branch use the same ones."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

PolicyName = Literal["greedy", "failure_aware"]  # search/policy.py: which frontier action is implemented next


class LLMSettings(BaseModel):
    model: str
    base_url: str | None = None
    # Name of the environment variable holding the key; the key itself never enters settings
    # (settings are checkpointed and logged).
    api_key_env: str = "OPENAI_API_KEY"
    temperature: float | None = Field(None, ge=0, le=2)
    max_tokens: int | None = Field(None, ge=1)
    structured_method: Literal["json_schema", "function_calling", "json_mode", "raw"] = "json_schema"
    timeout_s: float = 300
    max_retries: int = Field(5, ge=0, description="retries of a failed API call before pausing the run")
    backoff_s: float = Field(2.0, ge=0, description="first retry delay in seconds (doubles each time)")
    max_repairs: int = 2  # re-asks after an answer that is not valid JSON or fails validation
    price_prompt_per_mtok: float = 0
    price_completion_per_mtok: float = 0
    # Input tokens the provider read from its prompt cache (OpenAI-style usage.prompt_tokens_details.cached_tokens)
    # cost this instead; None: the full prompt price (no discount assumed).
    price_cached_prompt_per_mtok: float | None = Field(None, ge=0)
    # Send a tighter JSON schema for structured answers (see ``small_model_schema``): servers that
    # decode against the schema (llama.cpp) then keep a small model's answer short and in range. The
    # answer is still validated against the full pydantic model.
    small_model_schema: bool = False
    # The model's context window in tokens, when known. Prompts are shrunk so that prompt plus
    # max_tokens fits it, and a small window (a small local model) selects compact prompts.
    context_tokens: int | None = None
    # A model of local_llm.MODELS that ksearch serves itself for each run (``--llm local``). Its
    # base_url and context_tokens are filled in while the server runs and never saved: the port is
    # ephemeral, and a resumed run starts a new server sized for the machine it runs on.
    local_model: str | None = None


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
    # Where candidates' code runs (harness/judge/sandbox.py): bubblewrap, or "none" on a host without it (every result's
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
