"""The evaluation harness, split by the process each part runs in:

- ``parent/``: the search's side (``SubprocessEvaluator``, the local and Ray pools); the only part that imports the
  rest of ksearch_graph.
- ``judge/``: the judge process, one per evaluation: makes the inputs, runs the reference, checks and times the
  candidate through its own clock, and trusts nothing the candidate's process says.
- ``candidate/``: the candidate's process, in its OS sandbox: imports the candidate and answers the judge.
- this folder: what both processes share (the wires, ``job`` between parent and judge and ``wire`` between judge
  and candidate; the timer, the timing policy, tensors, shared memory, the task's calls and checks).

The judge and the candidate's process import only the standard library, torch (Triton and CuPy where a candidate or
the launch cover needs them) and this package."""
