"""Forward and backward of a loss, called by the problem's own eval.py."""


def reference_forward(logits, targets):
    return logits


def reference_backward(logits, targets, grad):
    return grad


def generate_inputs(batch, vocab_size, seed=0):
    return None
