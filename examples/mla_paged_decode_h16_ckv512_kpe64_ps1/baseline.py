"""MLA paged decode in plain PyTorch, arranged for speed: the baseline the harness times next to the reference.

Versus the per-sequence reference loop:
- sequences are grouped into buckets of similar length (KV lengths rounded up to a power of two), so a ragged batch
  costs a handful of padded batched GEMMs instead of a few small GEMMs per sequence, with at most 2x padding;
- each bucket gathers its compressed-KV and rope-key rows with one indexing op each and computes all 16 heads'
  logits as one batched GEMM plus one accumulated into it (baddbmm), then P @ Kc as one batched GEMM;
- softmax and lse in base 2 from one max and one sum, padding masked with -inf.
Strict fp32 math on bf16 inputs (no TF32), one host sync for the lengths. Device-agnostic (CPU or CUDA).
"""

import math

import torch

LOG2E = 1.0 / math.log(2.0)


def run(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale):
    batch, num_heads, ckv_dim = q_nope.shape
    kpe_dim = q_pe.shape[-1]
    device = q_nope.device
    output = torch.zeros(batch, num_heads, ckv_dim, dtype=torch.bfloat16, device=device)
    lse = torch.full((batch, num_heads), -math.inf, dtype=torch.float32, device=device)
    lens = kv_indptr[1:] - kv_indptr[:-1]
    lens_host = lens.tolist()
    buckets: dict[int, list[int]] = {}
    for b, n in enumerate(lens_host):
        if n > 0:  # empty sequences keep output 0 and lse -inf
            buckets.setdefault((n - 1).bit_length(), []).append(b)
    if not buckets:
        return output, lse
    ckv_tokens = ckv_cache.reshape(-1, ckv_dim)  # page size 1: one token per page
    kpe_tokens = kpe_cache.reshape(-1, kpe_dim)
    last = kv_indices.numel() - 1
    scale = float(sm_scale) * LOG2E  # logits in base-2 units
    for seqs in buckets.values():
        width = max(lens_host[b] for b in seqs)
        sel = torch.tensor(seqs, device=device)
        cols = torch.arange(width, device=device)
        pos = kv_indptr[sel].long()[:, None] + cols  # [S, W] positions in kv_indices
        valid = cols < lens[sel][:, None]
        pages = kv_indices[pos.clamp_(max=last)].long()
        kc = ckv_tokens[pages].float()  # [S, W, 512]
        kp = kpe_tokens[pages].float()  # [S, W, 64]
        logits = torch.baddbmm(torch.bmm(q_pe[sel].float(), kp.transpose(1, 2)), q_nope[sel].float(),
                               kc.transpose(1, 2)).mul_(scale)  # [S, H, W]
        logits.masked_fill_(~valid[:, None, :], -math.inf)
        m = logits.amax(dim=-1, keepdim=True)
        p = torch.exp2(logits.sub_(m))
        denom = p.sum(dim=-1, keepdim=True)
        output[sel] = torch.bmm(p, kc).div_(denom).to(torch.bfloat16)
        lse[sel] = (m + torch.log2(denom)).squeeze(-1)
    return output, lse
