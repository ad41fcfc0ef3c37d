"""Task formats: our task folder (task.json + reference.py), GPU MODE problems, KernelBench problems and
FlashInfer-Trace definitions, each read into a task folder; what an evaluation of a task returns (``evaluation``);
and the GPU peaks a task's speed of light is measured against."""
