"""GQA paged decode (32 query heads, 4 KV heads, head dim 128, page size 1), parameterised for the offline search
(render_template fills in the placeholders).

VARIANT picks the algorithm:
- single: one program per (sequence, KV head) walks the whole sequence with an online softmax (base 2). Few
  programs for a small batch: a batch of one uses only 4 of the GPU's SMs.
- split_kv: flash-decoding. Each sequence's pages are cut into NUM_SPLITS chunks (each a multiple of BLOCK_N, so
  short sequences leave later chunks empty), one program per (sequence, KV head, chunk) writes a partial output and
  its base-2 lse, and a second kernel merges the chunks per (sequence, query head). More parallelism for small
  batches and long sequences, at the cost of a second launch and a round trip of the partials through memory.
Both handle a KV head's 8 query heads together, padded to 16 rows for tl.dot.

DOT_DTYPE: "float32" gives the dots fp32 operands (bf16 inputs are exact in fp32 and TF32; P is rounded to TF32 on
the GPU); "bfloat16" keeps q, K, V in bf16 and rounds P to bf16 (FlashInfer's tensor-core decode does the same),
halving register use for the tiles. Triton's CPU interpreter mishandles bf16 tl.dot (it multiplies the raw bits), so
under TRITON_INTERPRET=1 the kernel always uses fp32 operands.
"""

import math
import os

import torch
import triton
import triton.language as tl

VARIANT = "{{VARIANT}}"
BLOCK_N = {{BLOCK_N}}
NUM_SPLITS = {{NUM_SPLITS}}
NUM_WARPS = {{NUM_WARPS}}
NUM_STAGES = {{NUM_STAGES}}
DOT_DTYPE = "{{DOT_DTYPE}}"

_BF16_DOT = DOT_DTYPE == "bfloat16" and os.environ.get("TRITON_INTERPRET") != "1"
_INV_LN2 = 1.0 / math.log(2.0)


@triton.jit
def _attend(q, k_ptr, v_ptr, indices_ptr, kv_head, lo, hi, qk_scale, stride_kp, stride_kh, stride_vp, stride_vh,
            GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BF16_DOT: tl.constexpr):
    """Online softmax over the tokens at kv_indices[lo:hi]: (running max, running sum, unnormalised output)."""
    d = tl.arange(0, HEAD_DIM)
    n = tl.arange(0, BLOCK_N)
    m = tl.full([GROUP_PAD], -float("inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for off in range(lo, hi, BLOCK_N):
        idx = off + n
        nmask = idx < hi
        page = tl.load(indices_ptr + idx, mask=nmask, other=0).to(tl.int64)
        row_mask = nmask[:, None]
        k = tl.load(k_ptr + page[:, None] * stride_kp + kv_head * stride_kh + d[None, :], mask=row_mask, other=0.0)
        v = tl.load(v_ptr + page[:, None] * stride_vp + kv_head * stride_vh + d[None, :], mask=row_mask, other=0.0)
        if not BF16_DOT:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # [GROUP_PAD, BLOCK_N], base-2 units
        s = tl.where(nmask[None, :], s, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))  # finite: every block has at least one real token
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    return m, l, acc


@triton.jit
def _load_q(q_ptr, b, kv_head, stride_qb, stride_qh, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
            HEAD_DIM: tl.constexpr, BF16_DOT: tl.constexpr):
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + g
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=(g < GROUP)[:, None], other=0.0)
    if not BF16_DOT:
        q = q.to(tl.float32)
    return q


@triton.jit
def _single(q_ptr, k_ptr, v_ptr, indptr_ptr, indices_ptr, o_ptr, lse_ptr, qk_scale,
            stride_qb, stride_qh, stride_kp, stride_kh, stride_vp, stride_vh, stride_ob, stride_oh, stride_lb,
            GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
            BF16_DOT: tl.constexpr):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    start = tl.load(indptr_ptr + b)
    end = tl.load(indptr_ptr + b + 1)
    q = _load_q(q_ptr, b, kv_head, stride_qb, stride_qh, GROUP, GROUP_PAD, HEAD_DIM, BF16_DOT)
    m, l, acc = _attend(q, k_ptr, v_ptr, indices_ptr, kv_head, start, end, qk_scale, stride_kp, stride_kh,
                        stride_vp, stride_vh, GROUP_PAD, HEAD_DIM, BLOCK_N, BF16_DOT)
    nonempty = l > 0.0
    safe_l = tl.where(nonempty, l, 1.0)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + g
    hmask = g < GROUP
    tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :], (acc / safe_l[:, None]).to(tl.bfloat16),
             mask=hmask[:, None])
    tl.store(lse_ptr + b * stride_lb + heads, tl.where(nonempty, m + tl.log2(safe_l), -float("inf")), mask=hmask)


@triton.jit
def _split(q_ptr, k_ptr, v_ptr, indptr_ptr, indices_ptr, mo_ptr, mlse_ptr, qk_scale,
           stride_qb, stride_qh, stride_kp, stride_kh, stride_vp, stride_vh,
           GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
           NUM_HEADS: tl.constexpr, NUM_SPLITS: tl.constexpr, BF16_DOT: tl.constexpr):
    """Partials: mo [B, H, NUM_SPLITS, D] (normalised chunk outputs), mlse [B, H, NUM_SPLITS] (chunk lse, base 2)."""
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    start = tl.load(indptr_ptr + b)
    end = tl.load(indptr_ptr + b + 1)
    chunk = tl.cdiv(tl.cdiv(end - start, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = tl.minimum(start + split * chunk, end)
    hi = tl.minimum(lo + chunk, end)
    q = _load_q(q_ptr, b, kv_head, stride_qb, stride_qh, GROUP, GROUP_PAD, HEAD_DIM, BF16_DOT)
    m, l, acc = _attend(q, k_ptr, v_ptr, indices_ptr, kv_head, lo, hi, qk_scale, stride_kp, stride_kh,
                        stride_vp, stride_vh, GROUP_PAD, HEAD_DIM, BLOCK_N, BF16_DOT)
    nonempty = l > 0.0
    safe_l = tl.where(nonempty, l, 1.0)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + g
    hmask = g < GROUP
    row = (b * NUM_HEADS + heads) * NUM_SPLITS + split
    tl.store(mo_ptr + row[:, None] * HEAD_DIM + d[None, :], acc / safe_l[:, None], mask=hmask[:, None])
    tl.store(mlse_ptr + row, tl.where(nonempty, m + tl.log2(safe_l), -float("inf")), mask=hmask)


@triton.jit
def _merge(mo_ptr, mlse_ptr, o_ptr, lse_ptr, stride_ob, stride_oh, stride_lb,
           HEAD_DIM: tl.constexpr, NUM_HEADS: tl.constexpr, NUM_SPLITS: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, NUM_SPLITS)
    d = tl.arange(0, HEAD_DIM)
    row = (b * NUM_HEADS + h) * NUM_SPLITS + s
    part_lse = tl.load(mlse_ptr + row)
    top = tl.max(part_lse, axis=0)
    top = tl.where(top == -float("inf"), 0.0, top)  # all chunks empty: every weight below is 0, not NaN
    w = tl.exp2(part_lse - top)
    total = tl.sum(w, axis=0)
    part_o = tl.load(mo_ptr + row[:, None] * HEAD_DIM + d[None, :])
    nonempty = total > 0.0
    safe = tl.where(nonempty, total, 1.0)
    out = tl.sum(w[:, None] * part_o, axis=0) / safe
    tl.store(o_ptr + b * stride_ob + h * stride_oh + d, out.to(tl.bfloat16))
    tl.store(lse_ptr + b * stride_lb + h, tl.where(nonempty, top + tl.log2(safe), -float("inf")))


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    q = q.contiguous()
    batch, num_qo_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_qo_heads // num_kv_heads
    group_pad = max(16, triton.next_power_of_2(group))
    k_tokens = k_cache.contiguous().view(-1, num_kv_heads, head_dim)  # page size 1: page id = token row
    v_tokens = v_cache.contiguous().view(-1, num_kv_heads, head_dim)
    output = torch.empty(batch, num_qo_heads, head_dim, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(batch, num_qo_heads, dtype=torch.float32, device=q.device)
    qk_scale = float(sm_scale) * _INV_LN2
    common = (q.stride(0), q.stride(1), k_tokens.stride(0), k_tokens.stride(1), v_tokens.stride(0), v_tokens.stride(1))
    if VARIANT == "single":
        _single[(batch, num_kv_heads)](
            q, k_tokens, v_tokens, kv_indptr, kv_indices, output, lse, qk_scale, *common,
            output.stride(0), output.stride(1), lse.stride(0),
            GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim, BLOCK_N=BLOCK_N, BF16_DOT=_BF16_DOT,
            num_warps=NUM_WARPS, num_stages=NUM_STAGES,
        )
        return output, lse
    mid_o = torch.empty(batch, num_qo_heads, NUM_SPLITS, head_dim, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(batch, num_qo_heads, NUM_SPLITS, dtype=torch.float32, device=q.device)
    _split[(batch, num_kv_heads, NUM_SPLITS)](
        q, k_tokens, v_tokens, kv_indptr, kv_indices, mid_o, mid_lse, qk_scale, *common,
        GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim, BLOCK_N=BLOCK_N, NUM_HEADS=num_qo_heads,
        NUM_SPLITS=NUM_SPLITS, BF16_DOT=_BF16_DOT, num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    _merge[(batch, num_qo_heads)](
        mid_o, mid_lse, output, lse, output.stride(0), output.stride(1), lse.stride(0),
        HEAD_DIM=head_dim, NUM_HEADS=num_qo_heads, NUM_SPLITS=NUM_SPLITS, num_warps=4,
    )
    return output, lse
