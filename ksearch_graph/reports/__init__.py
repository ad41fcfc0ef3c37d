"""What a finished run becomes: the HTML/Markdown report, exported kernels, FlashInfer-Trace solutions."""
