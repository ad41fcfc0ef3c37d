"""Baseline: batched, padded MLA prefill in plain PyTorch (what a careful engineer writes without FlashInfer).

The ragged batch is cut into pieces (a sequence, or a chunk of at most PIECE_Q of its queries); a piece only needs
the keys its last query can see. Pieces of similar shape are batched together and padded, so a batch of
decode-like queries or of equal-length prefills costs a few large matmuls, while a long chunk never pads a short
one. Per batch: gather the pages, one bmm for the logits (the 512 latent and 64 rotary dims concatenated, bf16
operands, fp32 result), the causal / length mask, log-sum-exp and softmax in fp32, and one bf16 bmm with
the latent values. One host sync reads the two indptr arrays.
"""

import math

import torch

PIECE_Q = 1024  # queries per piece at most
MAX_LOGITS = 1 << 29  # fp32 logits per batch at most (2 GB)
PAD_SLACK = 1.25  # a batch may do at most this much more work than its pieces need
HEADS_MAX = 16
LOG2E = 1.0 / math.log(2.0)


def _logits(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q [G, M, D] @ k [G, N, D]^T: bf16 operands, fp32 accumulation and fp32 result (a bf16 result would round
    logits in the hundreds by whole units)."""
    kt = k.transpose(1, 2)
    if q.is_cuda:
        try:
            return torch.bmm(q, kt, out_dtype=torch.float32)  # bf16 tensor cores, fp32 output (torch >= 2.8)
        except (TypeError, RuntimeError):
            pass
    return torch.bmm(q.float(), kt.float())  # the same products, exact in fp32


def _pieces(qo: list[int], kv: list[int]) -> list[tuple[int, int, int, int, int]]:
    """(first query row, queries, first kv slot, keys needed, causal offset) for each piece."""
    out = []
    for b in range(len(qo) - 1):
        q_len, kv_len = qo[b + 1] - qo[b], kv[b + 1] - kv[b]
        for c0 in range(0, q_len, PIECE_Q):
            n = min(PIECE_Q, q_len - c0)
            offset = kv_len - q_len + c0  # query i of the piece sees keys <= offset + i
            keys = max(0, min(kv_len, offset + n))
            out.append((qo[b] + c0, n, kv[b], keys, offset))
    return out


def _batches(pieces):
    """Group pieces of similar shape (sorted by queries, then keys) while padding stays cheap and memory bounded."""
    batch, work, mk = [], 0, 0
    for p in sorted(pieces, key=lambda p: (p[1], p[3])):
        cost = p[1] * p[3]
        if batch:
            padded = (len(batch) + 1) * p[1] * max(mk, p[3])  # p has the most queries so far
            if padded > PAD_SLACK * (work + cost) + 4096 or padded * HEADS_MAX > MAX_LOGITS:
                yield batch
                batch, work, mk = [], 0, 0
        batch.append(p)
        work += cost
        mk = max(mk, p[3])
    if batch:
        yield batch


def run(q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    total_q, heads, dc = q_nope.shape
    device = q_nope.device
    output = torch.zeros(total_q, heads, dc, dtype=torch.bfloat16, device=device)
    lse = torch.full((total_q, heads), -math.inf, dtype=torch.float32, device=device)
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    keys_all = torch.cat([ckv_cache.squeeze(1), kpe_cache.squeeze(1)], dim=-1)  # [P, 576]
    queries = torch.cat([q_nope, q_pe], dim=-1)  # [total_q, H, 576]
    for batch in _batches([p for p in _pieces(qo, kv) if p[1] > 0 and p[3] > 0]):
        g = len(batch)
        mq, mk = max(p[1] for p in batch), max(p[3] for p in batch)
        meta = torch.tensor([[p[0], p[1], p[2], p[3], p[4]] for p in batch], dtype=torch.int64).to(device)
        q0, nq, k0, nk, off = meta.unbind(1)
        ar_q = torch.arange(mq, device=device)
        ar_k = torch.arange(mk, device=device)
        q_valid = ar_q[None, :] < nq[:, None]  # [G, mq]
        q_rows = (q0[:, None] + ar_q[None, :]).clamp_(max=total_q - 1)
        slots = (k0[:, None] + ar_k[None, :]).clamp_(max=kv_indices.numel() - 1)
        pages = kv_indices[slots].long()  # [G, mk]; slots past a sequence's keys are masked below
        keys = keys_all[pages]  # [G, mk, 576]
        q = queries[q_rows].reshape(g, mq * heads, -1)  # rows: (query, head)
        logits = _logits(q, keys).view(g, mq, heads, mk)
        visible = (ar_k[None, None, :] <= (off[:, None] + ar_q[None, :])[:, :, None]) & (ar_k < nk[:, None])[:, None, :]
        logits.mul_(sm_scale).masked_fill_(~visible[:, :, None, :], -math.inf)
        lse_e = torch.logsumexp(logits, dim=-1)  # [G, mq, H]
        probs = torch.exp(logits.sub_(lse_e[..., None])).nan_to_num_(0.0)  # no visible key: exp(nan) -> 0
        out = torch.bmm(probs.view(g, mq * heads, mk).to(torch.bfloat16), keys[..., :dc])
        out = out.view(g, mq, heads, dc)
        output[q_rows[q_valid]] = out[q_valid]
        lse[q_rows[q_valid]] = lse_e[q_valid] * LOG2E
    return output, lse
