"""An honest TriMul submission of our own, plain PyTorch in strict fp32 (GPU MODE's ``custom_kernel(data)``).

Row-major throughout, unlike examples/trimul's seed (channel-major): the five projections are one GEMM into
[B*N*N, 5H], the gates and the mask applied in place, L and R copied into [B, H, N, N] planes for one batched
contraction, and the result copied back to [B, N, N, H] for the output LayerNorm and projection. The mask may be
float or integer (upstream's masked inputs are int64).
"""

import torch
import torch.nn.functional as F

PROJECTIONS = ("left_proj", "right_proj", "left_gate", "right_gate", "out_gate")


def custom_kernel(data):
    x, mask, w, config = data
    b, n, _, d = x.shape
    h = config["hidden_dim"]
    xn = F.layer_norm(x, (d,), w["norm.weight"], w["norm.bias"], eps=1e-5).reshape(-1, d)
    proj = xn @ torch.cat([w[f"{name}.weight"] for name in PROJECTIONS]).t()  # [B*N*N, 5H]
    del xn
    proj[:, 2 * h:].sigmoid_()
    both = proj[:, :2 * h] * proj[:, 2 * h:4 * h]  # [L | R], gated
    both *= mask.reshape(-1, 1).to(both.dtype)
    planes = both.view(b, n, n, 2, h).permute(3, 0, 4, 1, 2).contiguous()  # [2, B, H, N(i), N(k)]
    del both
    left, right = planes[0].view(b * h, n, n), planes[1].view(b * h, n, n)
    o = torch.bmm(left, right.transpose(1, 2)).view(b, h, n, n).permute(0, 2, 3, 1)  # O[b, i, j, h]
    o = F.layer_norm(o, (h,), w["to_out_norm.weight"], w["to_out_norm.bias"], eps=1e-5)
    o = o.reshape(-1, h) * proj[:, 4 * h:]
    return (o @ w["to_out.weight"].t()).view(b, n, n, d)
