"""GQA paged decode (32 query heads, 4 KV heads, head dim 128, page size 1): a plain Triton kernel, the seed.

One program per (sequence, KV head) handles that KV head's 8 query heads (padded to 16 rows for tl.dot), walks the
sequence's pages BLOCK_N at a time (gathering one token per page id), and keeps an online softmax in base 2.
Dots take fp32 operands (bf16 values are exact in fp32 and TF32). No split over the KV length: a batch of one long
sequence uses only 4 programs, which is the obvious thing to improve.
"""

import math

import torch
import triton
import triton.language as tl

BLOCK_N = 32
NUM_WARPS = 4


@triton.jit
def _gqa_decode(q_ptr, k_ptr, v_ptr, indptr_ptr, indices_ptr, o_ptr, lse_ptr, qk_scale,
                stride_qb, stride_qh, stride_kp, stride_kh, stride_vp, stride_vh, stride_ob, stride_oh, stride_lb,
                GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    start = tl.load(indptr_ptr + b)
    end = tl.load(indptr_ptr + b + 1)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    n = tl.arange(0, BLOCK_N)
    heads = kv_head * GROUP + g
    hmask = g < GROUP
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=hmask[:, None], other=0.0)
    q = q.to(tl.float32)
    m = tl.full([GROUP_PAD], -float("inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for off in range(start, end, BLOCK_N):
        idx = off + n
        nmask = idx < end
        page = tl.load(indices_ptr + idx, mask=nmask, other=0).to(tl.int64)
        row_mask = nmask[:, None]
        k = tl.load(k_ptr + page[:, None] * stride_kp + kv_head * stride_kh + d[None, :], mask=row_mask, other=0.0)
        v = tl.load(v_ptr + page[:, None] * stride_vp + kv_head * stride_vh + d[None, :], mask=row_mask, other=0.0)
        s = tl.dot(q, tl.trans(k.to(tl.float32))) * qk_scale  # [GROUP_PAD, BLOCK_N], base-2 units
        s = tl.where(nmask[None, :], s, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))  # finite: every block has at least one real token
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32))
        m = m_new
    nonempty = l > 0.0
    out = acc / tl.where(nonempty, l, 1.0)[:, None]  # an empty sequence: acc = 0, so output 0
    lse = tl.where(nonempty, m + tl.log2(tl.where(nonempty, l, 1.0)), -float("inf"))
    tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :], out.to(tl.bfloat16), mask=hmask[:, None])
    tl.store(lse_ptr + b * stride_lb + heads, lse, mask=hmask)


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    q = q.contiguous()
    k_cache = k_cache.contiguous()
    v_cache = v_cache.contiguous()
    batch, num_qo_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_qo_heads // num_kv_heads
    output = torch.empty(batch, num_qo_heads, head_dim, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(batch, num_qo_heads, dtype=torch.float32, device=q.device)
    k_tokens = k_cache.view(-1, num_kv_heads, head_dim)  # page size 1: page id = token row
    v_tokens = v_cache.view(-1, num_kv_heads, head_dim)
    _gqa_decode[(batch, num_kv_heads)](
        q, k_tokens, v_tokens, kv_indptr, kv_indices, output, lse, float(sm_scale) / math.log(2.0),
        q.stride(0), q.stride(1), k_tokens.stride(0), k_tokens.stride(1), v_tokens.stride(0), v_tokens.stride(1),
        output.stride(0), output.stride(1), lse.stride(0),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim, BLOCK_N=BLOCK_N,
        num_warps=NUM_WARPS,
    )
    return output, lse
