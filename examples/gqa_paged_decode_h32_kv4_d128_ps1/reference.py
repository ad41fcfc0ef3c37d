"""Inputs and reference for FlashInfer-Bench's gqa_paged_decode_h32_kv4_d128_ps1 (batched GQA decode attention
over a paged KV cache with one token per page).

    run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale) -> (output, lse)

q [B, 32, 128] bf16; k_cache, v_cache [P, 1, 4, 128] bf16 (pages, page size, KV heads, head dim); kv_indptr [B + 1]
int32; kv_indices [kv_indptr[-1]] int32 page ids; sm_scale a Python float (1/sqrt(128)). output [B, 32, 128] bf16,
lse [B, 32] fp32, the base-2 log-sum-exp of the scaled logits. Query head h reads KV head h // 8. A sequence with no
pages gives output 0 and lse -inf.

Workload params (everything is derived from params + the harness's seed):
- ``batch``; the KV lengths either as ``kv_lens`` (an explicit list) or as ``kv_len_range: [lo, hi]`` with
  ``kv_len_dist`` ("uniform" or "loguniform") and ``length_seed``. The lengths depend on the params only, never on
  the seed, so a workload's shape (and cost) is the same for every input set.
- ``distribution``: "normal" (q, k, v ~ N(0, 1)) or "heavy" (q and k standard Cauchy, clipped to +-HEAVY_CLIP so
  bf16 stays finite; v still N(0, 1)): a few logits in the hundreds dominate, so exp without the max-subtraction
  overflows. v keeps light tails so that bf16 tensor-core P @ V (as in FlashInfer's own kernels) stays within the
  tolerance.
- ``q_scale`` (default 1): multiplies q; larger values give sharper (more realistic, peaked) attention.
- ``pool_slack`` (default 0.25): the page pool holds ceil(total * (1 + slack)) + 16 pages; the pages of all
  sequences are a random subset of the pool in random order (not contiguous, not sorted).
"""

import math

import torch

NUM_QO_HEADS = 32
NUM_KV_HEADS = 4
HEAD_DIM = 128
PAGE_SIZE = 1
GROUP = NUM_QO_HEADS // NUM_KV_HEADS
HEAVY_CLIP = 50.0
LOG2E = 1.0 / math.log(2.0)


def kv_lengths(params: dict) -> list[int]:
    """The KV length of every sequence of a workload: a function of the params alone."""
    batch = int(params["batch"])
    if "kv_lens" in params:
        lens = [int(n) for n in params["kv_lens"]]
        if len(lens) != batch:
            raise ValueError(f"kv_lens has {len(lens)} entries for batch {batch}")
        return lens
    lo, hi = (int(n) for n in params["kv_len_range"])
    g = torch.Generator().manual_seed(int(params.get("length_seed", 0)))
    u = torch.rand(batch, generator=g, dtype=torch.float64)
    if params.get("kv_len_dist", "uniform") == "loguniform":
        lens = torch.exp(math.log(lo) + u * (math.log(hi + 1) - math.log(lo))).floor()
    else:
        lens = (lo + u * (hi - lo + 1)).floor()
    return [min(max(int(n), lo), hi) for n in lens]


def speed_of_light(params: dict) -> dict:
    """What any kernel must do (ksearch's speed-of-light floor): read the K and V rows of the pages the batch uses
    (not the whole pool), q, the page table, and write output and lse; two bf16 matmuls per KV head."""
    lens = kv_lengths(params)
    batch, total = len(lens), sum(lens)
    kv = total * NUM_KV_HEADS * HEAD_DIM * 2 * 2  # K and V, bf16
    q_out = 2 * batch * NUM_QO_HEADS * HEAD_DIM * 2  # q read, output written, bf16
    small = batch * NUM_QO_HEADS * 4 + total * 4 + (batch + 1) * 4  # lse (fp32), kv_indices, kv_indptr (int32)
    flops = 2 * 2 * NUM_QO_HEADS * HEAD_DIM * total  # q.k and p.v for every query head and token
    return {"bytes": kv + q_out + small, "flops": flops, "compute": "bf16"}


def _values(shape, params: dict, g: torch.Generator, device: str) -> torch.Tensor:
    if params.get("distribution", "normal") == "heavy":
        x = torch.rand(shape, generator=g, device=device).sub_(0.5).mul_(math.pi).tan_().clamp_(-HEAVY_CLIP, HEAVY_CLIP)
    else:
        x = torch.randn(shape, generator=g, device=device)
    return x


def make_inputs(params: dict, seed: int, device: str) -> tuple:
    lens = kv_lengths(params)
    batch, total = len(lens), sum(lens)
    pool = math.ceil(total * (1.0 + float(params.get("pool_slack", 0.25)))) + 16
    # The page table is small: draw it on the CPU. The caches are big: draw them on the device.
    g_cpu = torch.Generator().manual_seed(seed)
    kv_indices = torch.randperm(pool, generator=g_cpu)[:total].to(torch.int32)
    kv_indptr = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32)
    g = torch.Generator(device=device).manual_seed(seed)
    q = _values((batch, NUM_QO_HEADS, HEAD_DIM), params, g, device).mul_(float(params.get("q_scale", 1.0)))
    k_cache = _values((pool, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM), params, g, device).to(torch.bfloat16)
    # Heavy tails only in q and k (the logits), as in real caches; v stays N(0, 1).
    v_cache = torch.randn((pool, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM), generator=g, device=device).to(torch.bfloat16)
    sm_scale = 1.0 / math.sqrt(HEAD_DIM)
    return (q.to(torch.bfloat16), k_cache, v_cache, kv_indptr.to(device), kv_indices.to(device), sm_scale)


def reference(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    """One sequence at a time, straight from the definition, in float32."""
    batch, num_qo_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_qo_heads // num_kv_heads
    output = torch.zeros(batch, num_qo_heads, head_dim, dtype=torch.bfloat16, device=q.device)
    lse = torch.full((batch, num_qo_heads), -math.inf, dtype=torch.float32, device=q.device)
    k_tokens = k_cache.reshape(-1, num_kv_heads, head_dim)  # page size 1: one token per page
    v_tokens = v_cache.reshape(-1, num_kv_heads, head_dim)
    indptr = kv_indptr.tolist()
    for b in range(batch):
        start, end = indptr[b], indptr[b + 1]
        if start == end:
            continue
        pages = kv_indices[start:end].long()
        k = k_tokens[pages].float()  # [L, KVH, D]
        v = v_tokens[pages].float()
        qb = q[b].float().reshape(num_kv_heads, group, head_dim)  # head h = kv_head * group + g
        logits = torch.einsum("kgd,lkd->kgl", qb, k) * float(sm_scale)  # [KVH, G, L]
        lse[b] = (torch.logsumexp(logits, dim=-1) * LOG2E).reshape(num_qo_heads)
        p = torch.softmax(logits, dim=-1)
        output[b] = torch.einsum("kgl,lkd->kgd", p, v).reshape(num_qo_heads, head_dim).to(torch.bfloat16)
    return output, lse
