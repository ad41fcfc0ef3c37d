"""TriMul in plain PyTorch, strict fp32, arranged for speed: a GPU MODE-style submission.py (``custom_kernel(data)``).

Versus the reference's one-op-per-line form, two things:
- the five projections are one GEMM (x' is read once, not five times);
- everything after it runs channel-major, [H, B*N*N]: that GEMM writes L and R directly as H*B contiguous [N, N]
  planes, so the triangle contraction is one batched GEMM with no transposing copies (in the [B, N, N, H] layout,
  those copies cost about as much as the contraction itself on an H200), and the final projection reads the
  channel-major result through a transposed GEMM operand instead of a copy.
Strict fp32 throughout; allowing TF32 (or bf16 operands for the contraction) is the obvious next step and fits the
2e-2 tolerance.
"""

import torch
import torch.nn.functional as F

_PROJECTIONS = ("left_proj", "right_proj", "left_gate", "right_gate", "out_gate")


def custom_kernel(data):
    x, mask, w, config = data
    b, n, _, d = x.shape
    h = config["hidden_dim"]

    xn = F.layer_norm(x, (d,), w["norm.weight"], w["norm.bias"], eps=1e-5).view(-1, d)
    p = torch.cat([w[f"{k}.weight"] for k in _PROJECTIONS]) @ xn.t()  # [5H, B*N*N]: L, R, L gate, R gate, out gate
    del xn
    p[2 * h:].sigmoid_()  # p is ours, so the gates are applied in place
    lr = p[: 2 * h] * p[2 * h: 4 * h]
    lr *= mask.reshape(1, -1).to(lr.dtype)
    gate = p[4 * h:]

    # Row c*B + b of the planes is channel c of batch b, laid out [i, k]; O[c, b] = L[c, b] @ R[c, b]^T.
    planes = lr.view(2 * h * b, n, n)
    o = torch.bmm(planes[: h * b], planes[h * b:].transpose(1, 2)).view(h, -1)  # [H, B*N*N], (i, j) per batch
    del lr, planes

    # LayerNorm over H, which is dim 0 here.
    var, mean = torch.var_mean(o, dim=0, unbiased=False)
    o -= mean
    o *= torch.rsqrt(var + 1e-5)
    o *= w["to_out_norm.weight"][:, None]
    o += w["to_out_norm.bias"][:, None]
    o *= gate
    return (o.t() @ w["to_out.weight"].t()).view(b, n, n, d)
