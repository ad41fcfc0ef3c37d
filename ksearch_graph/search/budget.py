"""Hard budgets: an attempt or an LLM call starts only while the run's record says the budget allows it.

The record is store.sqlite: the iterations done are the evaluated attempts it holds (the seed is none), tokens and
cost its ledger, time its active seconds. A cycle is launched with an allowance, but that is a plan, not a right:
before an attempt's code is asked for, and again before a generated attempt is evaluated, the attempt claims its
iteration here, and the claim is refused once the recorded attempts plus those claimed and not yet recorded reach
the budget. So a resume or a branch with a new budget obeys it exactly, whatever allowance the cycle in progress
began with, and cycles side by side (lanes, samples) never overshoot it together: the largest ratio of iterations
run to the budget is 1.0. Caps (tokens, cost, time) are checked before every LLM call and every attempt; the tokens
of a call already under way may carry the total past its cap, no call starts after.
"""

from __future__ import annotations

import threading

from ksearch_graph.config import SearchConfig
from ksearch_graph.rundir.store import RunStore


class BudgetSpent(Exception):
    """A cap (tokens, cost, time) is reached: the LLM call about to start must not."""


class BudgetGate:
    def __init__(self, config: SearchConfig, store: RunStore):
        self.config = config  # read live: a campaign moves the caps while its searches run
        self.store = store
        self._lock = threading.Lock()
        self._claimed: set[str] = set()  # granted to an attempt of this process, not recorded yet

    def claim(self, attempt_ids: list[str]) -> list[str]:
        """The leading ``attempt_ids`` that may run, in order: one already recorded (nothing new is spent: its
        evaluation is reused), one this process claimed before, then new ones while the iteration budget has room."""
        granted = []
        with self._lock:
            self._forget_recorded()
            for attempt_id in attempt_ids:
                recorded = self.store.get_attempt(attempt_id) is not None
                if not (recorded or attempt_id in self._claimed):
                    if self._iterations_used() >= self.config.budget.iterations:
                        break
                    self._claimed.add(attempt_id)
                granted.append(attempt_id)
        return granted

    def release(self, attempt_id: str) -> None:
        """The attempt is recorded (it counts from the store now) or will not run."""
        with self._lock:
            self._claimed.discard(attempt_id)

    def iterations_done(self) -> int:
        return self.store.count_attempts()

    def iteration_stop_reason(self) -> str | None:
        """Why no further attempt may start, counting those claimed and in flight; None while one may."""
        with self._lock:
            self._forget_recorded()
            used = self._iterations_used()
        budget = self.config.budget.iterations
        return f"iteration budget spent ({used}/{budget})" if used >= budget else None

    def iterations_left(self) -> int:
        with self._lock:
            self._forget_recorded()
            return max(0, self.config.budget.iterations - self._iterations_used())

    def cap_stop_reason(self) -> str | None:
        """Why no LLM call may start: a token, cost or time cap reached (all are run-wide, over every resume)."""
        budget = self.config.budget
        if budget.max_tokens is not None or budget.max_cost_usd is not None:
            totals = self.store.token_totals()
            if budget.max_tokens is not None and totals["total_tokens"] >= budget.max_tokens:
                return f"token budget spent ({totals['total_tokens']}/{budget.max_tokens})"
            if budget.max_cost_usd is not None and totals["cost_usd"] >= budget.max_cost_usd:
                return f"cost budget spent (${totals['cost_usd']:.2f}/${budget.max_cost_usd:.2f})"
        if budget.max_wall_s is not None:
            spent = self.store.active_seconds()
            if spent >= budget.max_wall_s:
                return f"time budget spent ({spent:.0f}s/{budget.max_wall_s:.0f}s)"
        return None

    def check_llm_call(self) -> None:
        """Raise BudgetSpent when a cap allows no further LLM call."""
        if (reason := self.cap_stop_reason()) is not None:
            raise BudgetSpent(reason)

    def stop_reason(self) -> str | None:
        """Why no further attempt may start: the iteration budget or a cap."""
        return self.iteration_stop_reason() or self.cap_stop_reason()

    def _iterations_used(self) -> int:
        return self.store.count_attempts() + len(self._claimed)

    def _forget_recorded(self) -> None:
        """Claims whose attempt was recorded (by this process, or found recorded after a resume) count once."""
        for attempt_id in [a for a in self._claimed if self.store.get_attempt(a) is not None]:
            self._claimed.discard(attempt_id)
