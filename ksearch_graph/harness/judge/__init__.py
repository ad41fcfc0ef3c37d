"""The judge process: everything it checks itself (inputs it made, outputs compared against its reference, times by
its own clock, the candidate's CPU time from its cgroup), the candidate's sandbox, and the result it writes."""
