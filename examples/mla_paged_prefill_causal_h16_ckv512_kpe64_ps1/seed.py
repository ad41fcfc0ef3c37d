"""Seed: a straightforward flash-attention style Triton kernel for causal MLA prefill over a paged KV cache.

One program per query token, all 16 heads at once (the heads share the single latent KV head, so each key tile is
loaded once for 16 rows). The program walks the keys its query can see in tiles of BLOCK_N pages: gather the
page ids, load the latent tile [BLOCK_N, 512] and the rotary tile [BLOCK_N, 64], S = q_nope Kc^T + q_pe Kp^T,
online softmax in base 2, and acc += P Kc (the latent tile is also the value tile). No host sync.

Under TRITON_INTERPRET=1 (CPU) the dot operands are fp32 instead of bf16: the interpreter multiplies bf16 bit
patterns in tl.dot (triton-lang/triton#11584). On a GPU the operands are bf16 with fp32 accumulation.
"""

import math
import os

import torch
import triton
import triton.language as tl

DOT_BF16 = os.environ.get("TRITON_INTERPRET") != "1"
LOG2E = 1.0 / math.log(2.0)


@triton.jit
def _mla_prefill_token(
    q_nope_ptr, q_pe_ptr, ckv_ptr, kpe_ptr, qo_indptr_ptr, kv_indptr_ptr, kv_indices_ptr, out_ptr, lse_ptr,
    batch, qk_scale,
    s_qn_t, s_qn_h, s_qp_t, s_qp_h, s_ckv, s_kpe, s_o_t, s_o_h, s_l_t,
    H: tl.constexpr, DC: tl.constexpr, DP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr,
    DOT_BF16: tl.constexpr,
):
    t = tl.program_id(0)
    # Which sequence this token belongs to: the number of sequences that end at or before it.
    bs = tl.arange(0, BLOCK_B)
    ends = tl.load(qo_indptr_ptr + 1 + bs, mask=bs < batch, other=2147483647)
    b = tl.sum((ends <= t).to(tl.int32), axis=0)
    q_start = tl.load(qo_indptr_ptr + b)
    q_len = tl.load(qo_indptr_ptr + b + 1) - q_start
    kv_start = tl.load(kv_indptr_ptr + b)
    kv_len = tl.load(kv_indptr_ptr + b + 1) - kv_start
    last = kv_len - q_len + (t - q_start)  # the last key position this query sees
    n_keys = tl.minimum(kv_len, last + 1)

    h = tl.arange(0, H)
    dc = tl.arange(0, DC)
    dp = tl.arange(0, DP)
    qn = tl.load(q_nope_ptr + t * s_qn_t + h[:, None] * s_qn_h + dc[None, :]).to(tl.float32)
    qp = tl.load(q_pe_ptr + t * s_qp_t + h[:, None] * s_qp_h + dp[None, :]).to(tl.float32)
    if DOT_BF16:
        qn = qn.to(tl.bfloat16)
        qp = qp.to(tl.bfloat16)

    m_i = tl.full([H], -float("inf"), tl.float32)
    l_i = tl.zeros([H], tl.float32)
    acc = tl.zeros([H, DC], tl.float32)
    n = tl.arange(0, BLOCK_N)
    for start in range(0, n_keys, BLOCK_N):
        valid = start + n < n_keys
        page = tl.load(kv_indices_ptr + kv_start + start + n, mask=valid, other=0).to(tl.int64)
        kc = tl.load(ckv_ptr + page[:, None] * s_ckv + dc[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        kp = tl.load(kpe_ptr + page[:, None] * s_kpe + dp[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        if DOT_BF16:
            kc = kc.to(tl.bfloat16)
            kp = kp.to(tl.bfloat16)
        s = tl.dot(qn, tl.trans(kc)) + tl.dot(qp, tl.trans(kp))  # [H, BLOCK_N], fp32
        s = tl.where(valid[None, :], s * qk_scale, -float("inf"))  # base-2 logits
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if DOT_BF16:
            acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), kc)
        else:
            acc = acc * alpha[:, None] + tl.dot(p, kc)
        m_i = m_new

    seen = l_i > 0.0  # false only when the query sees no key at all
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), -float("inf"))
    tl.store(out_ptr + t * s_o_t + h[:, None] * s_o_h + dc[None, :], out.to(out_ptr.dtype.element_ty))
    tl.store(lse_ptr + t * s_l_t + h, lse)


def run(q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    total_q, heads, dc = q_nope.shape
    dp = q_pe.shape[-1]
    batch = qo_indptr.numel() - 1
    output = torch.empty(total_q, heads, dc, dtype=torch.bfloat16, device=q_nope.device)
    lse = torch.empty(total_q, heads, dtype=torch.float32, device=q_nope.device)
    if total_q == 0:
        return output, lse
    q_nope, q_pe = q_nope.contiguous(), q_pe.contiguous()
    ckv, kpe = ckv_cache.reshape(-1, dc).contiguous(), kpe_cache.reshape(-1, dp).contiguous()
    _mla_prefill_token[(total_q,)](
        q_nope, q_pe, ckv, kpe, qo_indptr, kv_indptr, kv_indices, output, lse,
        batch, float(sm_scale) * LOG2E,
        q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1), ckv.stride(0), kpe.stride(0),
        output.stride(0), output.stride(1), lse.stride(0),
        H=heads, DC=dc, DP=dp, BLOCK_N=32, BLOCK_B=max(16, triton.next_power_of_2(batch)), DOT_BF16=DOT_BF16,
        num_warps=4,
    )
    return output, lse
