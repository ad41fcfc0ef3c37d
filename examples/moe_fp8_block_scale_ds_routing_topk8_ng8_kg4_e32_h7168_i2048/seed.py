"""Seed: DeepSeek-V3 FP8 block-scale MoE for one rank (32 local experts) as two Triton grouped-GEMM kernels.

1. Routing in PyTorch: s = sigmoid(logits), sb = s + bias, group score = sum of the top-2 sb of each group of 32,
   top-4 groups, top-8 experts by sb among them, weights = s of those, normalised, times routed_scaling_factor.
2. The (token, local expert) pairs are sorted by expert on the device and each expert's pairs cut into blocks of
   BLOCK_M rows; a program finds its expert from a small table of block offsets (no host sync; programs past the
   last block exit at once).
3. GEMM1 + SwiGLU: per block and BLOCK_N intermediate columns, the FP8 token rows against both halves of W13
   (up = rows n, gate = rows I + n) with FP8 tensor-core dots; each 128-wide K step's partial product is scaled by
   the token's activation scale and the weight block's scale. C = silu(gate) * up, stored in bf16.
4. GEMM2: C against W2 (FP8 upcast to bf16, exact), per-block weight scale, times the routing weight, atomically
   added into an fp32 [T, 7168] buffer, cast to bf16 at the end.

Under TRITON_INTERPRET=1 (CPU) the bf16 dot operands of GEMM2 are fp32 instead (the interpreter mishandles bf16
tl.dot, triton-lang/triton#11584); FP8 dots work there.
"""

import math
import os

import torch
import triton
import triton.language as tl

BLOCK_M, BLOCK_N, BLOCK_K = 16, 128, 128  # BLOCK_K must divide the 128-wide scale blocks
NUM_WARPS, NUM_STAGES = 4, 3

DOT_BF16 = os.environ.get("TRITON_INTERPRET") != "1"
N_GROUP, TOPK_GROUP, TOP_K, QBLOCK = 8, 4, 8, 128


@triton.jit
def _find_block(blk_indptr_ptr, pair_start_ptr, counts_ptr, pid, E: tl.constexpr, BLOCK_M: tl.constexpr):
    """(expert, first sorted row of the block, rows of the expert left from there); expert == E: no block."""
    es = tl.arange(0, E)
    ends = tl.load(blk_indptr_ptr + 1 + es)
    e = tl.sum((ends <= pid).to(tl.int32), axis=0)
    e_safe = tl.minimum(e, E - 1)
    r0 = (pid - tl.load(blk_indptr_ptr + e_safe)) * BLOCK_M
    return e, tl.load(pair_start_ptr + e_safe) + r0, tl.load(counts_ptr + e_safe) - r0


@triton.jit
def _gemm1_swiglu(
    a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, c_ptr, sorted_tok_ptr, blk_indptr_ptr, pair_start_ptr, counts_ptr,
    T, H, I,
    s_a, s_w_e, s_w_n, s_ws_e, s_ws_n, s_c,
    E: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    e, row0, rows_left = _find_block(blk_indptr_ptr, pair_start_ptr, counts_ptr, tl.program_id(0), E, BLOCK_M)
    if e < E:
        rm = tl.arange(0, BLOCK_M)
        row_ok = rm < rows_left
        srow = row0 + rm
        tok = tl.load(sorted_tok_ptr + srow, mask=row_ok, other=0).to(tl.int64)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < I
        kk = tl.arange(0, BLOCK_K)
        w_up = w_ptr + e.to(tl.int64) * s_w_e + n[:, None].to(tl.int64) * s_w_n
        w_gate = w_up + I * s_w_n
        ws_up = w_scale_ptr + e * s_ws_e + (n // 128) * s_ws_n
        ws_gate = w_scale_ptr + e * s_ws_e + ((I + n) // 128) * s_ws_n
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        acc_gate = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, H, BLOCK_K):
            k = k0 + kk
            kb = k0 // 128
            a = tl.load(a_ptr + tok[:, None] * s_a + k[None, :], mask=row_ok[:, None], other=0.0)
            a_s = tl.load(a_scale_ptr + kb * T + tok, mask=row_ok, other=0.0)
            wu = tl.load(w_up + k[None, :], mask=n_ok[:, None], other=0.0)
            wg = tl.load(w_gate + k[None, :], mask=n_ok[:, None], other=0.0)
            su = tl.load(ws_up + kb, mask=n_ok, other=0.0)
            sg = tl.load(ws_gate + kb, mask=n_ok, other=0.0)
            # FP8 x FP8 on the tensor cores (exact products, fp32 accumulation); scales on each K step's result.
            acc_up += tl.dot(a, tl.trans(wu)) * a_s[:, None] * su[None, :]
            acc_gate += tl.dot(a, tl.trans(wg)) * a_s[:, None] * sg[None, :]
        c = acc_up * (acc_gate / (1.0 + tl.exp(-acc_gate)))  # silu(gate) * up
        tl.store(c_ptr + srow[:, None].to(tl.int64) * s_c + n[None, :], c.to(c_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def _gemm2_combine(
    c_ptr, w_ptr, w_scale_ptr, out_ptr, sorted_tok_ptr, sorted_w_ptr, blk_indptr_ptr, pair_start_ptr, counts_ptr,
    H, I,
    s_c, s_w_e, s_w_n, s_ws_e, s_ws_n, s_o,
    E: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_BF16: tl.constexpr,
):
    e, row0, rows_left = _find_block(blk_indptr_ptr, pair_start_ptr, counts_ptr, tl.program_id(0), E, BLOCK_M)
    if e < E:
        rm = tl.arange(0, BLOCK_M)
        row_ok = rm < rows_left
        srow = row0 + rm
        tok = tl.load(sorted_tok_ptr + srow, mask=row_ok, other=0).to(tl.int64)
        wt = tl.load(sorted_w_ptr + srow, mask=row_ok, other=0.0)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < H
        kk = tl.arange(0, BLOCK_K)
        w_rows = w_ptr + e.to(tl.int64) * s_w_e + n[:, None].to(tl.int64) * s_w_n
        ws = w_scale_ptr + e * s_ws_e + (n // 128) * s_ws_n
        c_rows = c_ptr + srow[:, None].to(tl.int64) * s_c
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, I, BLOCK_K):
            k = k0 + kk
            c = tl.load(c_rows + k[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
            w = tl.load(w_rows + k[None, :], mask=n_ok[:, None], other=0.0).to(tl.float32)
            s = tl.load(ws + k0 // 128, mask=n_ok, other=0.0)
            if DOT_BF16:
                c = c.to(tl.bfloat16)
                w = w.to(tl.bfloat16)  # exact: every e4m3 value is a bf16 value
            acc += tl.dot(c, tl.trans(w)) * s[None, :]
        acc = acc * wt[:, None]
        tl.atomic_add(out_ptr + tok[:, None] * s_o + n[None, :], acc, mask=row_ok[:, None] & n_ok[None, :])


def _route(routing_logits, routing_bias, routed_scaling_factor):
    t, e = routing_logits.shape
    s = torch.sigmoid(routing_logits.float())
    sb = s + routing_bias.float()
    group_scores = sb.view(t, N_GROUP, e // N_GROUP).topk(2, dim=-1).values.sum(-1)
    groups = group_scores.topk(TOPK_GROUP, dim=-1).indices
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)
    keep = keep.repeat_interleave(e // N_GROUP, dim=1)
    experts = sb.masked_fill(~keep, -math.inf).topk(TOP_K, dim=-1).indices
    w = s.gather(1, experts)
    return experts, w * (routed_scaling_factor / w.sum(-1, keepdim=True))


def run(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
                        gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, local_expert_offset,
                        routed_scaling_factor):
    t, hidden = hidden_states.shape
    n_local, two_i, _ = gemm1_weights.shape
    inter = two_i // 2
    device = hidden_states.device
    experts, weights = _route(routing_logits, routing_bias, float(routed_scaling_factor))

    # Sort the (token, local expert) pairs by expert; pairs of other ranks get id n_local and sort last.
    local = experts - int(local_expert_offset)
    eid = torch.where((local >= 0) & (local < n_local), local, n_local).flatten()
    order = torch.argsort(eid, stable=True)
    sorted_tok = (order // TOP_K).to(torch.int32)
    sorted_w = weights.flatten()[order].contiguous()
    counts = torch.bincount(eid, minlength=n_local + 1)[:n_local]
    pair_start = (torch.cumsum(counts, 0) - counts).to(torch.int32)
    blk_indptr = torch.zeros(n_local + 1, dtype=torch.int32, device=device)
    blk_indptr[1:] = torch.cumsum((counts + BLOCK_M - 1) // BLOCK_M, 0)
    counts = counts.to(torch.int32)
    max_blocks = triton.cdiv(t * TOP_K, BLOCK_M) + n_local  # enough for any routing; idle programs exit at once

    a_scale = hidden_states_scale.contiguous()
    w1, w1s = gemm1_weights.contiguous(), gemm1_weights_scale.contiguous()
    w2, w2s = gemm2_weights.contiguous(), gemm2_weights_scale.contiguous()
    c = torch.empty(t * TOP_K, inter, dtype=torch.bfloat16, device=device)
    _gemm1_swiglu[(max_blocks, triton.cdiv(inter, BLOCK_N))](
        hidden_states, a_scale, w1, w1s, c, sorted_tok, blk_indptr, pair_start, counts,
        t, hidden, inter,
        hidden_states.stride(0), w1.stride(0), w1.stride(1), w1s.stride(0), w1s.stride(1), c.stride(0),
        E=n_local, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    out = torch.zeros(t, hidden, dtype=torch.float32, device=device)
    _gemm2_combine[(max_blocks, triton.cdiv(hidden, BLOCK_N))](
        c, w2, w2s, out, sorted_tok, sorted_w, blk_indptr, pair_start, counts,
        hidden, inter,
        c.stride(0), w2.stride(0), w2.stride(1), w2s.stride(0), w2s.stride(1), out.stride(0),
        E=n_local, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, DOT_BF16=DOT_BF16,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return out.to(torch.bfloat16)
