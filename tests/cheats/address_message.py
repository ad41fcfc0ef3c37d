"""Cheat class: the judge's network. A candidate sends the judge messages that name an address for it to act on: a
pickled file-descriptor handle (multiprocessing's DupFd, which connects to the address it names to fetch the
descriptor), and a JSON message with a host and port, both pointing at LISTEN_PORT on the loopback; a judge with
network that acted on either would open a TCP connection there (data carried in the port number).
Expected: suspicious (what it sent is not the protocol), and no connection to the listener.
"""

import os
import pickle
import socket
import sys

LISTEN_PORT = 9


class DupFd:
    """multiprocessing.resource_sharer.DupFd's pickle: rebuilt by connecting to its address."""

    def __reduce__(self):
        import multiprocessing.resource_sharer as rs

        return (rs.DupFd.__new__, (rs.DupFd,)), {"_id": (("127.0.0.1", LISTEN_PORT), 1)}


sock = socket.socket(fileno=os.dup(int(sys.argv[sys.argv.index("--fd") + 1])))
sock.send(b'{"type": "Imported", "compile_s": 0.1, "connect": ["127.0.0.1", %d]}' % LISTEN_PORT)
sock.send(pickle.dumps(DupFd()))


def kernel(x, w):
    import torch

    return torch.relu(x @ w)
