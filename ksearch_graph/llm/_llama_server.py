"""Child process of ``local_llm.LocalServer``: llama.cpp's HTTP server until stdin closes.

argv: MODEL_PATH MODEL_NAME CONTEXT THREADS PORT. Prints one JSON line {"base_url": ...} once the
model is loaded. Reading stdin to EOF is the shutdown signal: the parent closes it to stop us, and
the OS closes it when the parent dies for any reason, so the server never outlives the search (on
Linux the kernel also kills us with the parent).
"""

import ctypes
import json
import os
import signal
import sys

import xllamacpp


def _die_with_parent() -> None:
    """On Linux, also ask the kernel to kill us when the parent dies, whatever our threads are doing."""
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def main() -> None:
    _die_with_parent()
    model_path, model_name, context, threads, port = sys.argv[1:6]
    params = xllamacpp.CommonParams()
    params.model.path = model_path
    params.model_alias = {model_name}
    params.n_ctx = int(context)
    params.n_parallel = 1  # one request at a time gets the whole context
    params.cpuparams.n_threads = int(threads)
    params.cpuparams_batch.n_threads = int(threads)
    params.hostnames = ["127.0.0.1"]
    params.port = int(port)
    server = xllamacpp.Server(params)  # returns once the model is loaded and the server listens
    print(json.dumps({"base_url": server.listening_address}), flush=True)
    sys.stdin.read()
    # Exit at once: a graceful shutdown waits for the request in flight, which can take minutes on a
    # CPU (docs/llm.md), and the server keeps no state.
    os._exit(0)


if __name__ == "__main__":
    main()
