"""GQA paged decode in plain PyTorch, arranged for speed: the baseline the harness times next to the reference.

Versus the per-sequence reference loop:
- sequences are grouped into buckets of similar length (KV lengths rounded up to a power of two), so a ragged batch
  costs a handful of padded batched GEMMs instead of one small GEMM pair per sequence, with at most 2x padding;
- each bucket gathers its pages with one indexing op, computes the 8 query heads of a KV head as one [8, D] x
  [D, L] GEMM (no repeat of K/V per query head), and masks the padding with -inf;
- softmax and lse in base 2 from one max and one sum.
Strict fp32 math on bf16 inputs (no TF32), one host sync for the lengths. Device-agnostic (CPU or CUDA).
"""

import math

import torch

LOG2E = 1.0 / math.log(2.0)


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    batch, num_qo_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_qo_heads // num_kv_heads
    device = q.device
    output = torch.zeros(batch, num_qo_heads, head_dim, dtype=torch.bfloat16, device=device)
    lse = torch.full((batch, num_qo_heads), -math.inf, dtype=torch.float32, device=device)
    lens = kv_indptr[1:] - kv_indptr[:-1]
    lens_host = lens.tolist()
    buckets: dict[int, list[int]] = {}
    for b, n in enumerate(lens_host):
        if n > 0:  # empty sequences keep output 0 and lse -inf
            buckets.setdefault((n - 1).bit_length(), []).append(b)
    if not buckets:
        return output, lse
    k_tokens = k_cache.reshape(-1, num_kv_heads, head_dim)  # page size 1: one token per page
    v_tokens = v_cache.reshape(-1, num_kv_heads, head_dim)
    last = kv_indices.numel() - 1
    scale = float(sm_scale) * LOG2E  # logits in base-2 units
    for seqs in buckets.values():
        width = max(lens_host[b] for b in seqs)
        sel = torch.tensor(seqs, device=device)
        cols = torch.arange(width, device=device)
        pos = kv_indptr[sel].long()[:, None] + cols  # [S, W] positions in kv_indices
        valid = cols < lens[sel][:, None]
        pages = kv_indices[pos.clamp_(max=last)].long()
        k = k_tokens[pages].float().transpose(1, 2)  # [S, KVH, W, D]
        v = v_tokens[pages].float().transpose(1, 2)
        qs = q[sel].float().view(len(seqs), num_kv_heads, group, head_dim)  # head h = kv_head * group + g
        logits = torch.matmul(qs, k.transpose(-1, -2)).mul_(scale)  # [S, KVH, G, W]
        logits.masked_fill_(~valid[:, None, None, :], -math.inf)
        m = logits.amax(dim=-1, keepdim=True)
        p = torch.exp2(logits.sub_(m))
        denom = p.sum(dim=-1, keepdim=True)
        o = torch.matmul(p, v).div_(denom)  # [S, KVH, G, D]
        output[sel] = o.view(len(seqs), num_qo_heads, head_dim).to(torch.bfloat16)
        lse[sel] = (m + torch.log2(denom)).view(len(seqs), num_qo_heads)
    return output, lse
