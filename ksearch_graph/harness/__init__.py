"""The evaluation harness: the parent's client (``client.py``), the judge process (``judge.py``) and the candidate's
process (``runner.py``), with what they share. The two processes import only the standard library, torch (Triton
and CuPy where a candidate or the launch cover needs them) and this package; ``client.py`` is the only module here
that imports the rest of ksearch_graph."""
