"""Causal MLA paged prefill, parameterised for the offline search (render_template fills in the placeholders).

A program owns BLOCK_M consecutive query tokens of one sequence and all 16 heads: BLOCK_M * 16 rows that share
every key tile, because MLA has a single latent KV head. Query blocks never straddle two sequences; a small
device-side table (block offsets per sequence, from the indptr arrays, no host sync) maps program ids to blocks.
The key loop stops at the last key the block's last query can see, and the causal mask is applied per row.

VARIANT picks how the work is split:
- fused: one program computes logits, the online softmax and the full 512-wide output accumulator.
- split_dv: 512 / BLOCK_DV programs per query block; each recomputes the logits (576-wide dot) but accumulates
  only a BLOCK_DV-wide slice of the output. More programs and a smaller accumulator for short, decode-like
  batches, at the cost of repeating the QK^T work.

Under TRITON_INTERPRET=1 (CPU) the dot operands are fp32 (the interpreter mishandles bf16 tl.dot); on a GPU they
are bf16 with fp32 accumulation.
"""

import math
import os

import torch
import triton
import triton.language as tl

VARIANT = "{{VARIANT}}"
BLOCK_M = {{BLOCK_M}}
BLOCK_N = {{BLOCK_N}}
BLOCK_DV = {{BLOCK_DV}}
NUM_WARPS = {{NUM_WARPS}}
NUM_STAGES = {{NUM_STAGES}}

DOT_BF16 = os.environ.get("TRITON_INTERPRET") != "1"
LOG2E = 1.0 / math.log(2.0)


@triton.jit
def _mla_prefill_block(
    q_nope_ptr, q_pe_ptr, ckv_ptr, kpe_ptr, qo_indptr_ptr, kv_indptr_ptr, kv_indices_ptr, blk_indptr_ptr,
    out_ptr, lse_ptr,
    batch, qk_scale,
    s_qn_t, s_qn_h, s_qp_t, s_qp_h, s_ckv, s_kpe, s_o_t, s_o_h, s_l_t,
    H: tl.constexpr, DC: tl.constexpr, DP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_DV: tl.constexpr, BLOCK_B: tl.constexpr, DOT_BF16: tl.constexpr,
):
    pid = tl.program_id(0)
    dv0 = tl.program_id(1) * BLOCK_DV
    bs = tl.arange(0, BLOCK_B)
    blk_ends = tl.load(blk_indptr_ptr + 1 + bs, mask=bs < batch, other=2147483647)
    b = tl.sum((blk_ends <= pid).to(tl.int32), axis=0)
    if b < batch:
        m0 = (pid - tl.load(blk_indptr_ptr + b)) * BLOCK_M  # first query of the block, within its sequence
        q_start = tl.load(qo_indptr_ptr + b)
        q_len = tl.load(qo_indptr_ptr + b + 1) - q_start
        kv_start = tl.load(kv_indptr_ptr + b)
        kv_len = tl.load(kv_indptr_ptr + b + 1) - kv_start

        r = tl.arange(0, BLOCK_M * H)  # row = (query, head), query-major
        qi = m0 + r // H  # query index within the sequence
        head = r % H
        row_ok = qi < q_len
        tok = q_start + qi
        last = kv_len - q_len + qi  # the last key position each row sees
        n_keys = tl.minimum(kv_len, kv_len - q_len + tl.minimum(q_len, m0 + BLOCK_M))

        dc = tl.arange(0, DC)
        dp = tl.arange(0, DP)
        dv = dv0 + tl.arange(0, BLOCK_DV)
        qn = tl.load(q_nope_ptr + tok[:, None] * s_qn_t + head[:, None] * s_qn_h + dc[None, :],
                     mask=row_ok[:, None], other=0.0).to(tl.float32)
        qp = tl.load(q_pe_ptr + tok[:, None] * s_qp_t + head[:, None] * s_qp_h + dp[None, :],
                     mask=row_ok[:, None], other=0.0).to(tl.float32)
        if DOT_BF16:
            qn = qn.to(tl.bfloat16)
            qp = qp.to(tl.bfloat16)

        m_i = tl.full([BLOCK_M * H], -float("inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M * H], tl.float32)
        acc = tl.zeros([BLOCK_M * H, BLOCK_DV], tl.float32)
        n = tl.arange(0, BLOCK_N)
        for start in range(0, n_keys, BLOCK_N):
            key = start + n
            valid = key < n_keys
            page = tl.load(kv_indices_ptr + kv_start + key, mask=valid, other=0).to(tl.int64)
            kc = tl.load(ckv_ptr + page[:, None] * s_ckv + dc[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
            kp = tl.load(kpe_ptr + page[:, None] * s_kpe + dp[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
            if BLOCK_DV == DC:
                vv = kc
            else:
                vv = tl.load(ckv_ptr + page[:, None] * s_ckv + dv[None, :], mask=valid[:, None], other=0.0)
                vv = vv.to(tl.float32)
            if DOT_BF16:
                kc = kc.to(tl.bfloat16)
                kp = kp.to(tl.bfloat16)
                vv = vv.to(tl.bfloat16)
            s = tl.dot(qn, tl.trans(kc)) + tl.dot(qp, tl.trans(kp))  # [BLOCK_M * H, BLOCK_N]
            see = valid[None, :] & (key[None, :] <= last[:, None])
            s = tl.where(see, s * qk_scale, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)  # rows that have seen nothing yet
            p = tl.exp2(s - m_safe[:, None])
            alpha = tl.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if DOT_BF16:
                acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), vv)
            else:
                acc = acc * alpha[:, None] + tl.dot(p, vv)
            m_i = m_new

        seen = l_i > 0.0
        out = acc / tl.where(seen, l_i, 1.0)[:, None]
        tl.store(out_ptr + tok[:, None] * s_o_t + head[:, None] * s_o_h + dv[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
        if dv0 == 0:
            lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), -float("inf"))
            tl.store(lse_ptr + tok * s_l_t + head, lse, mask=row_ok)


def run(q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    total_q, heads, dc = q_nope.shape
    dp = q_pe.shape[-1]
    batch = qo_indptr.numel() - 1
    device = q_nope.device
    output = torch.empty(total_q, heads, dc, dtype=torch.bfloat16, device=device)
    lse = torch.empty(total_q, heads, dtype=torch.float32, device=device)
    if total_q == 0:
        return output, lse
    block_dv = dc if VARIANT == "fused" else min(BLOCK_DV, dc)
    # Query blocks per sequence and their running offsets, on the device.
    q_lens = (qo_indptr[1:] - qo_indptr[:-1]).to(torch.int32)
    blk_indptr = torch.zeros(batch + 1, dtype=torch.int32, device=device)
    blk_indptr[1:] = torch.cumsum((q_lens + BLOCK_M - 1) // BLOCK_M, 0)
    max_blocks = total_q // BLOCK_M + batch  # at least the real number of blocks; extra programs exit at once
    q_nope, q_pe = q_nope.contiguous(), q_pe.contiguous()
    ckv, kpe = ckv_cache.reshape(-1, dc).contiguous(), kpe_cache.reshape(-1, dp).contiguous()
    grid = (max_blocks, dc // block_dv)
    _mla_prefill_block[grid](
        q_nope, q_pe, ckv, kpe, qo_indptr, kv_indptr, kv_indices, blk_indptr, output, lse,
        batch, float(sm_scale) * LOG2E,
        q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1), ckv.stride(0), kpe.stride(0),
        output.stride(0), output.stride(1), lse.stride(0),
        H=heads, DC=dc, DP=dp, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_DV=block_dv,
        BLOCK_B=max(16, triton.next_power_of_2(batch)), DOT_BF16=DOT_BF16,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return output, lse
