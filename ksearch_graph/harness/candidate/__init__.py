"""The candidate's process, the only place candidate code runs: the runner that imports it and answers the judge,
and the in-process guards (audit hook, integrity snapshot), a first filter only: the judge trusts none of it."""
