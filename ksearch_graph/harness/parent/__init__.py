"""The parent's side of the harness, in the search's process: the evaluator that starts one judge per evaluation, the
local pool (one lease per GPU or CPU slot), the Ray pool and what it ships to workers, and the failures that are
not the candidate's."""
