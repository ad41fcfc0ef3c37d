"""Inputs and reference for batched causal MLA prefill over a paged KV cache (page size 1).

DeepSeek-V2/V3 Multi-head Latent Attention in its "absorbed" form, as FlashInfer-Bench defines
``mla_paged_prefill_causal_h16_ckv512_kpe64_ps1``: every query head attends to one shared latent KV head whose
keys are the compressed KV (``ckv``, 512 wide) concatenated with the rotary part (``kpe``, 64 wide), and whose
values are the compressed KV itself.

``make_inputs(params, seed, device)`` builds one batch from ``params["seqs"]``, a list of ``[q_len, kv_len]``
pairs (the new tokens of a sequence and its whole KV length, new tokens included), with page tables drawn as a
random permutation of a larger page pool. Everything else comes from ``seed``.
"""

import math

import torch

NUM_HEADS, HEAD_DIM_CKV, HEAD_DIM_KPE = 16, 512, 64
SM_SCALE = 1.0 / math.sqrt(128 + 64)  # DeepSeek-V3: qk_nope_head_dim 128 + qk_rope_head_dim 64
LOG2E = 1.0 / math.log(2.0)
HEAVY_CLIP = 50.0
Q_CHUNK = 2048  # queries per reference step, so the fp32 logits of a long chunk stay a few GB


def _layout(params: dict) -> tuple[list[tuple[int, int]], int]:
    seqs = [(int(q), int(kv)) for q, kv in params["seqs"]]
    shared = int(params.get("shared_prefix", 0))
    for q, kv in seqs:
        if q < 0 or kv < 0:
            raise ValueError(f"negative length in {params['seqs']}")
        if shared and kv < shared:
            raise ValueError(f"shared_prefix {shared} is longer than a sequence's kv_len {kv}")
    return seqs, shared


def speed_of_light(params: dict) -> dict:
    """What any kernel must do (ksearch's speed-of-light floor): read every distinct KV page once (a shared prefix
    once), the queries and the page tables, write output and lse; bf16 matmuls over the (query, key) pairs the
    causal mask leaves visible: 512 + 64 wide for the logits, 512 wide for P @ Kc."""
    seqs, shared = _layout(params)
    heads = int(params.get("num_heads", NUM_HEADS))
    dc = int(params.get("head_dim_ckv", HEAD_DIM_CKV))
    dp = int(params.get("head_dim_kpe", HEAD_DIM_KPE))
    total_q = sum(q for q, _ in seqs)
    distinct = shared + sum(kv - shared for _, kv in seqs)
    cache = distinct * (dc + dp) * 2
    q_out = total_q * heads * (dc + dp + dc) * 2 + total_q * heads * 4  # q_nope, q_pe, output (bf16); lse (fp32)
    tables = sum(kv for _, kv in seqs) * 4 + 2 * (len(seqs) + 1) * 4
    # Query i of a sequence (0-based) sees keys 0 .. kv_len - q_len + i.
    visible = sum(max(0, kv - q + i + 1) for q, kv in seqs for i in range(q))
    flops = 2 * heads * (dc + dp + dc) * visible
    return {"bytes": cache + q_out + tables, "flops": flops, "compute": "bf16"}


def make_inputs(params: dict, seed: int, device: str) -> tuple:
    """Params: ``seqs`` [[q_len, kv_len], ...] (required); ``shared_prefix`` (default 0): every sequence's first
    that many KV positions use the same pages (a prefix-cache hit on a common system prompt); ``distribution``:
    ``normal`` (default) or ``heavy`` (queries and rotary keys standard Cauchy clipped to +-HEAVY_CLIP: a few
    logits in the hundreds); ``sm_scale`` (default 1/sqrt(192)); ``num_heads``, ``head_dim_ckv``,
    ``head_dim_kpe`` (defaults 16, 512, 64)."""
    seqs, shared = _layout(params)
    heads = int(params.get("num_heads", NUM_HEADS))
    dc = int(params.get("head_dim_ckv", HEAD_DIM_CKV))
    dp = int(params.get("head_dim_kpe", HEAD_DIM_KPE))
    sm_scale = float(params.get("sm_scale", SM_SCALE))
    distribution = params.get("distribution", "normal")
    if distribution not in ("normal", "heavy"):
        raise ValueError(f"unknown distribution {distribution!r}")
    g = torch.Generator(device=device).manual_seed(seed)

    total_q = sum(q for q, _ in seqs)
    distinct = shared + sum(kv - shared for _, kv in seqs)
    # The pool holds other requests' pages too: a quarter more than this batch needs, in random order.
    pool = distinct + distinct // 4 + 16
    perm = torch.randperm(pool, generator=g, device=device).to(torch.int32)
    prefix, cursor, tables = perm[:shared], shared, []
    for _, kv in seqs:
        tables += [prefix, perm[cursor:cursor + kv - shared]]
        cursor += kv - shared
    kv_indices = torch.cat(tables) if tables else perm[:0]

    qo_indptr = torch.tensor([0] + [q for q, _ in seqs], dtype=torch.int64).cumsum(0).to(torch.int32).to(device)
    kv_indptr = torch.tensor([0] + [kv for _, kv in seqs], dtype=torch.int64).cumsum(0).to(torch.int32).to(device)

    # Latent KV after its RMSNorm and the rotary key: about unit scale. Queries get a per-head scale so some
    # heads attend almost uniformly and others to a handful of keys (logit std from ~0.5 to ~3.5). The latent KV
    # is also the value, so it keeps light tails in both distributions.
    def draw(*shape):
        if distribution == "normal":
            return torch.randn(*shape, generator=g, device=device)
        u = torch.rand(*shape, generator=g, device=device)
        return torch.tan(math.pi * (u - 0.5)).clamp_(-HEAVY_CLIP, HEAVY_CLIP)

    ckv = torch.randn(pool, 1, dc, generator=g, device=device).to(torch.bfloat16)
    kpe = draw(pool, 1, dp).to(torch.bfloat16)
    head_scale = torch.empty(1, heads, 1, device=device).uniform_(0.3, 2.0, generator=g)
    q_nope = (draw(total_q, heads, dc) * head_scale).to(torch.bfloat16)
    q_pe = (draw(total_q, heads, dp) * head_scale).to(torch.bfloat16)
    return q_nope, q_pe, ckv, kpe, qo_indptr, kv_indptr, kv_indices, sm_scale


def reference(q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    """Per sequence, in fp32: logits = (q_nope Kc^T + q_pe Kp^T) * sm_scale, causal mask, softmax, times Kc.

    Returns (output [total_q, H, 512] bf16, lse [total_q, H] fp32, base 2). A query that sees no key (its
    sequence has fewer keys than queries before it) gets a zero output row and lse = -inf.
    """
    total_q, heads, dc = q_nope.shape
    device = q_nope.device
    kc_all = ckv_cache.squeeze(1).float()
    kp_all = kpe_cache.squeeze(1).float()
    output = torch.zeros(total_q, heads, dc, dtype=torch.bfloat16, device=device)
    lse = torch.full((total_q, heads), -math.inf, dtype=torch.float32, device=device)
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(qo) - 1):
        q_len, kv_len = qo[b + 1] - qo[b], kv[b + 1] - kv[b]
        if q_len == 0 or kv_len == 0:
            continue
        pages = kv_indices[kv[b]:kv[b + 1]].long()
        kc, kp = kc_all[pages], kp_all[pages]  # [kv_len, 512], [kv_len, 64]
        for c0 in range(0, q_len, Q_CHUNK):
            c1 = min(q_len, c0 + Q_CHUNK)
            rows = slice(qo[b] + c0, qo[b] + c1)
            logits = torch.einsum("qhd,kd->qhk", q_nope[rows].float(), kc)
            logits += torch.einsum("qhd,kd->qhk", q_pe[rows].float(), kp)
            logits *= sm_scale
            # Query i (0-based within the sequence) sees keys 0 .. kv_len - q_len + i.
            last = torch.arange(c0, c1, device=device) + (kv_len - q_len)
            visible = torch.arange(kv_len, device=device)[None, :] <= last[:, None]  # [q, kv]
            logits.masked_fill_(~visible[:, None, :], -math.inf)
            lse_e = torch.logsumexp(logits, dim=-1)  # natural log, -inf for a query that sees nothing
            probs = torch.exp(logits - lse_e[..., None])
            probs = torch.where(visible.any(-1)[:, None, None], probs, torch.zeros_like(probs))
            output[rows] = torch.einsum("qhk,kd->qhd", probs, kc).to(torch.bfloat16)
            lse[rows] = lse_e * LOG2E
    return output, lse
