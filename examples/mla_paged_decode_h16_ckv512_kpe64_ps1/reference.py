"""Inputs and reference for FlashInfer-Bench's mla_paged_decode_h16_ckv512_kpe64_ps1 (DeepSeek multi-head latent
attention in its absorbed form, batched decode over a paged cache with one token per page).

    run(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale) -> (output, lse)

q_nope [B, 16, 512], q_pe [B, 16, 64], ckv_cache [P, 1, 512], kpe_cache [P, 1, 64] (all bf16); kv_indptr [B + 1]
int32; kv_indices [kv_indptr[-1]] int32 page ids; sm_scale a Python float (1/sqrt(192)). With Kc, Kp the gathered
cache rows of a sequence: logits = (q_nope Kc^T + q_pe Kp^T) * sm_scale, output = softmax(logits) Kc, i.e. the
compressed KV is both the (no-rope part of the) key and the value. output [B, 16, 512] bf16, lse [B, 16] fp32, the
base-2 log-sum-exp of the scaled logits. A sequence with no pages gives output 0 and lse -inf.

Workload params (everything is derived from params + the harness's seed):
- ``batch``; the KV lengths either as ``kv_lens`` (an explicit list) or as ``kv_len_range: [lo, hi]`` with
  ``kv_len_dist`` ("uniform" or "loguniform") and ``length_seed``. The lengths depend on the params only, never on
  the seed, so a workload's shape (and cost) is the same for every input set.
- ``distribution``: "normal" (everything N(0, 1)) or "heavy" (q_nope, q_pe and kpe standard Cauchy, clipped to
  +-HEAVY_CLIP so bf16 stays finite; ckv still N(0, 1)): a few logits in the hundreds dominate, so exp without the
  max-subtraction overflows. ckv, which is also the value, keeps light tails so that bf16 tensor-core P @ Kc stays
  within the tolerance.
- ``q_scale`` (default 1): multiplies q_nope and q_pe; larger values give sharper (more peaked) attention.
- ``pool_slack`` (default 0.25): the page pool holds ceil(total * (1 + slack)) + 16 pages; the pages of all
  sequences are a random subset of the pool in random order (not contiguous, not sorted).
"""

import math

import torch

NUM_HEADS = 16
CKV_DIM = 512
KPE_DIM = 64
PAGE_SIZE = 1
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
    """What any kernel must do (ksearch's speed-of-light floor): read the ckv and kpe rows of the pages the batch
    uses (not the whole pool), the queries and the page table, write output and lse; bf16 matmuls for the logits
    (512 + 64 wide) and for P @ Kc (512 wide)."""
    lens = kv_lengths(params)
    batch, total = len(lens), sum(lens)
    cache = total * (CKV_DIM + KPE_DIM) * 2
    q_out = batch * NUM_HEADS * (CKV_DIM + KPE_DIM + CKV_DIM) * 2  # q_nope, q_pe read, output written
    small = batch * NUM_HEADS * 4 + total * 4 + (batch + 1) * 4  # lse, kv_indices, kv_indptr
    flops = 2 * NUM_HEADS * (CKV_DIM + KPE_DIM + CKV_DIM) * total
    return {"bytes": cache + q_out + small, "flops": flops, "compute": "bf16"}


def _values(shape, heavy: bool, g: torch.Generator, device: str) -> torch.Tensor:
    if heavy:
        u = torch.rand(shape, generator=g, device=device)
        return u.sub_(0.5).mul_(math.pi).tan_().clamp_(-HEAVY_CLIP, HEAVY_CLIP)  # standard Cauchy, clipped
    return torch.randn(shape, generator=g, device=device)


def make_inputs(params: dict, seed: int, device: str) -> tuple:
    lens = kv_lengths(params)
    batch, total = len(lens), sum(lens)
    pool = math.ceil(total * (1.0 + float(params.get("pool_slack", 0.25)))) + 16
    heavy = params.get("distribution", "normal") == "heavy"
    # The page table is small: draw it on the CPU. The caches are big: draw them on the device.
    g_cpu = torch.Generator().manual_seed(seed)
    kv_indices = torch.randperm(pool, generator=g_cpu)[:total].to(torch.int32)
    kv_indptr = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32)
    g = torch.Generator(device=device).manual_seed(seed)
    q_scale = float(params.get("q_scale", 1.0))
    q_nope = _values((batch, NUM_HEADS, CKV_DIM), heavy, g, device).mul_(q_scale).to(torch.bfloat16)
    q_pe = _values((batch, NUM_HEADS, KPE_DIM), heavy, g, device).mul_(q_scale).to(torch.bfloat16)
    ckv_cache = _values((pool, PAGE_SIZE, CKV_DIM), False, g, device).to(torch.bfloat16)
    kpe_cache = _values((pool, PAGE_SIZE, KPE_DIM), heavy, g, device).to(torch.bfloat16)
    sm_scale = 1.0 / math.sqrt(128 + KPE_DIM)  # DeepSeek's qk head dim: 128 (nope) + 64 (rope)
    return (q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr.to(device), kv_indices.to(device), sm_scale)


def reference(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale):
    """One sequence at a time, straight from the definition, in float32."""
    batch, num_heads, ckv_dim = q_nope.shape
    kpe_dim = q_pe.shape[-1]
    output = torch.zeros(batch, num_heads, ckv_dim, dtype=torch.bfloat16, device=q_nope.device)
    lse = torch.full((batch, num_heads), -math.inf, dtype=torch.float32, device=q_nope.device)
    ckv_tokens = ckv_cache.reshape(-1, ckv_dim)  # page size 1: one token per page
    kpe_tokens = kpe_cache.reshape(-1, kpe_dim)
    indptr = kv_indptr.tolist()
    for b in range(batch):
        start, end = indptr[b], indptr[b + 1]
        if start == end:
            continue
        pages = kv_indices[start:end].long()
        kc = ckv_tokens[pages].float()  # [L, 512]
        kp = kpe_tokens[pages].float()  # [L, 64]
        logits = (q_nope[b].float() @ kc.T + q_pe[b].float() @ kp.T) * float(sm_scale)  # [H, L]
        lse[b] = torch.logsumexp(logits, dim=-1) * LOG2E
        output[b] = (torch.softmax(logits, dim=-1) @ kc).to(torch.bfloat16)
    return output, lse
