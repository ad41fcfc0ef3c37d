"""Baseline: the MoE layer as a grouped GEMM in plain PyTorch (what a careful engineer writes without a fused kernel).

Vectorised routing; the (token, local expert) pairs sorted by expert with one host sync for the per-expert counts;
the activations dequantised to bf16 once; then for every local expert that received tokens: dequantise its two
weight matrices blockwise to bf16 (fp32 multiply by the 128x128 block scales, one rounding), gather its tokens,
bf16 tensor-core GEMM with an fp32 result, SwiGLU in fp32, C in bf16, second GEMM (fp32 result), and a weighted
index_add into an fp32 output. Experts without tokens cost nothing, so small batches only touch the few experts
they use.
"""

import math

import torch
import torch.nn.functional as F

N_GROUP, TOPK_GROUP, TOP_K, BLOCK = 8, 4, 8, 128


def _route(routing_logits, routing_bias, routed_scaling_factor):
    t, e = routing_logits.shape
    s = torch.sigmoid(routing_logits.float())
    sb = s + routing_bias.float()
    group_scores = sb.view(t, N_GROUP, e // N_GROUP).topk(2, dim=-1).values.sum(-1)
    groups = group_scores.topk(TOPK_GROUP, dim=-1).indices
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)
    experts = sb.masked_fill(~keep.repeat_interleave(e // N_GROUP, dim=1), -math.inf).topk(TOP_K, dim=-1).indices
    w = s.gather(1, experts)
    return experts, w * (routed_scaling_factor / w.sum(-1, keepdim=True))


def _mm_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for bf16 operands with fp32 accumulation and an fp32 result (no rounding of G1 or O to bf16)."""
    if a.is_cuda:
        try:
            return torch.mm(a, b, out_dtype=torch.float32)  # bf16 tensor cores, fp32 output (torch >= 2.8)
        except (TypeError, RuntimeError):
            pass
    return a.float() @ b.float()  # the same products, exact in fp32


def _dequant_bf16(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp8 [R, C] with per-128x128-block scales [R/128, C/128] -> bf16 [R, C]."""
    r, c = q.shape
    w = q.float().view(r // BLOCK, BLOCK, c // BLOCK, BLOCK) * scale[:, None, :, None]
    return w.to(torch.bfloat16).view(r, c)


def run(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
        gemm2_weights, gemm2_weights_scale, local_expert_offset, routed_scaling_factor):
    t, hidden = hidden_states.shape
    n_local, two_i, _ = gemm1_weights.shape
    inter = two_i // 2
    experts, weights = _route(routing_logits, routing_bias, float(routed_scaling_factor))
    local = experts - int(local_expert_offset)
    is_local = (local >= 0) & (local < n_local)
    tok, slot = is_local.nonzero(as_tuple=True)
    eid = local[tok, slot]
    order = torch.argsort(eid, stable=True)
    tok, eid, w = tok[order], eid[order], weights[tok, slot][order]
    counts = torch.bincount(eid, minlength=n_local).tolist()  # the one host sync

    out = torch.zeros(t, hidden, dtype=torch.float32, device=hidden_states.device)
    if tok.numel() == 0:
        return out.to(torch.bfloat16)
    a = (hidden_states.float().view(t, hidden // BLOCK, BLOCK) * hidden_states_scale.t()[:, :, None])
    a = a.to(torch.bfloat16).view(t, hidden)
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        rows = tok[start:start + n]
        w13 = _dequant_bf16(gemm1_weights[e], gemm1_weights_scale[e])  # [2I, H]
        g1 = _mm_f32(a[rows], w13.t())  # [n, 2I] fp32
        c = (F.silu(g1[:, inter:]) * g1[:, :inter]).to(torch.bfloat16)
        w2 = _dequant_bf16(gemm2_weights[e], gemm2_weights_scale[e])  # [H, I]
        o = _mm_f32(c, w2.t())
        out.index_add_(0, rows, o * w[start:start + n, None])
        start += n
    return out.to(torch.bfloat16)
