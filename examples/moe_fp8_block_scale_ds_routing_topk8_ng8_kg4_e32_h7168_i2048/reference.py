"""Inputs and reference for the DeepSeek-V3 routed-expert MoE layer with FP8 block-scaled weights and activations,
one expert-parallel rank of 32 local experts out of 256 (FlashInfer-Bench
``moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048``).

The reference is dimension-generic (sizes come from the tensors), so the tests can run it with a tiny hidden and
intermediate size; the task's workloads use the real ones (hidden 7168, intermediate 2048).
"""

import math

import torch

NUM_EXPERTS = 256  # global experts (routing is over all of them)
NUM_LOCAL_EXPERTS = 32
N_GROUP, TOPK_GROUP, TOP_K = 8, 4, 8
BLOCK = 128  # quantisation block: 128x128 for weights, 1x128 (per token) for activations
HIDDEN, INTERMEDIATE = 7168, 2048
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
ROUTING_MARGIN = 1e-4  # make_inputs keeps every top-k decision at least this far from a tie


# --- inputs -----------------------------------------------------------------------------------------------------


def quantize_blocks(x: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise the last two dims of x in rows x cols blocks: fp8 values and one fp32 scale per block, so that
    x ~= fp8 * scale. Each block's absmax maps to the largest fp8 e4m3 value (448)."""
    *lead, r, c = x.shape
    blocks = x.reshape(*lead, r // rows, rows, c // cols, cols)
    scale = blocks.abs().amax(dim=(-3, -1), keepdim=True).clamp_min(1e-12) / FP8_MAX
    q = (blocks / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8).reshape(*lead, r, c)
    return q, scale.reshape(*lead, r // rows, c // cols).float()


def route(routing_logits: torch.Tensor, routing_bias: torch.Tensor, routed_scaling_factor: float):
    """DeepSeek-V3 no-aux-loss routing, in fp32: (top-k expert ids [T, 8] int64, their weights [T, 8] fp32).

    s = sigmoid(logits); sb = s + bias; group score = sum of the two largest sb in each group of 32; keep the 4 best
    groups; the 8 largest sb among their experts are selected; weight = s / sum(s over the 8) * routed_scaling_factor.
    """
    t, e = routing_logits.shape
    s = torch.sigmoid(routing_logits.float())
    sb = s + routing_bias.float()
    group_scores = sb.view(t, N_GROUP, e // N_GROUP).topk(2, dim=-1).values.sum(-1)  # [T, 8]
    groups = group_scores.topk(TOPK_GROUP, dim=-1).indices  # [T, 4]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)
    keep = keep[:, :, None].expand(t, N_GROUP, e // N_GROUP).reshape(t, e)
    experts = sb.masked_fill(~keep, -math.inf).topk(TOP_K, dim=-1).indices  # [T, 8]
    w = s.gather(1, experts)
    w = w / w.sum(-1, keepdim=True) * routed_scaling_factor
    return experts, w


def routing_margins(routing_logits: torch.Tensor, routing_bias: torch.Tensor) -> torch.Tensor:
    """Per token, the smallest gap between a kept and a dropped candidate (4th vs 5th group score, 8th vs 9th
    expert among the kept groups). A tiny gap means the selection could flip with rounding."""
    t, e = routing_logits.shape
    sb = torch.sigmoid(routing_logits.float()) + routing_bias.float()
    group_scores = sb.view(t, N_GROUP, e // N_GROUP).topk(2, dim=-1).values.sum(-1)
    g = group_scores.sort(dim=-1, descending=True)
    group_gap = g.values[:, TOPK_GROUP - 1] - g.values[:, TOPK_GROUP]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, g.indices[:, :TOPK_GROUP], True)
    keep = keep[:, :, None].expand(t, N_GROUP, e // N_GROUP).reshape(t, e)
    top = sb.masked_fill(~keep, -math.inf).topk(TOP_K + 1, dim=-1).values
    return torch.minimum(group_gap, top[:, TOP_K - 1] - top[:, TOP_K])


def _routing_logits(t: int, kind: str, local_offset: int, g: torch.Generator, device: str) -> torch.Tensor:
    """Router logits with a realistic, skewed expert load.

    Every token mixes a per-batch expert popularity (some experts are hot in any given batch), a preference of its
    request (tokens of a batch come from a few requests on a few topics) and its own noise. ``hot_local`` makes
    this rank's experts popular (a heavy rank), ``uniform`` drops the popularity and topic terms.
    """
    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device)

    noise = randn(t, NUM_EXPERTS)
    if kind == "uniform":
        return noise - 2.0
    popularity = 0.8 * randn(NUM_EXPERTS)
    if kind == "hot_local":
        popularity[local_offset:local_offset + NUM_LOCAL_EXPERTS] += 1.5
    elif kind != "skewed":
        raise ValueError(f"unknown routing kind {kind!r}")
    n_topics = 4
    topics = 0.9 * randn(n_topics, NUM_EXPERTS)
    which = torch.randint(0, n_topics, (t,), generator=g, device=device)
    return noise + popularity + topics[which] - 2.0


def draw_routing(t: int, kind: str, offset: int, g: torch.Generator, device: str):
    """(routing_bias [256] bf16, routing_logits [T, 256] fp32), the first draws of make_inputs.

    The correction bias is bf16 (as stored in the checkpoint). Tokens whose top-k selection sits within
    ROUTING_MARGIN of a tie are redrawn, so that any correct fp32 routing selects the same experts.
    """
    routing_bias = (0.1 * torch.randn(NUM_EXPERTS, generator=g, device=device)).to(torch.bfloat16)
    logits = _routing_logits(t, kind, offset, g, device)
    for _ in range(50):
        close = routing_margins(logits, routing_bias) < ROUTING_MARGIN
        if not bool(close.any()):
            return routing_bias, logits
        logits = torch.where(close[:, None], logits + 0.05 * torch.randn(t, NUM_EXPERTS, generator=g, device=device),
                             logits)
    raise RuntimeError("could not draw routing logits without near-ties")


SOL_ROUTING_DRAWS = 4  # routings drawn for the speed-of-light estimate; the fewest experts and pairs are kept


def speed_of_light(params: dict) -> dict:
    """What any kernel must do (ksearch's speed-of-light floor): read the routing inputs, the FP8 activations and
    their scales, the FP8 weights and scales of the local experts some token selected, write the bf16 output; FP8
    matmuls for every (token, local expert) pair: gate/up (H -> 2I) and down (I -> H).

    Which experts are selected depends on the routing the seed draws: this draws it for a few seeds on the CPU and
    keeps the fewest experts and pairs, an estimate (the hidden seeds and the GPU's generator draw other routings).
    """
    t = int(params["T"])
    hidden = int(params.get("hidden_size", HIDDEN))
    inter = int(params.get("intermediate_size", INTERMEDIATE))
    offset = int(params.get("local_expert_offset", 0))
    experts_hit, pairs = NUM_LOCAL_EXPERTS, t * TOP_K
    for seed in range(SOL_ROUTING_DRAWS):
        bias, logits = draw_routing(t, params.get("routing", "skewed"), offset, torch.Generator().manual_seed(seed),
                                    "cpu")
        experts, _ = route(logits, bias, 1.0)
        local = experts[(experts >= offset) & (experts < offset + NUM_LOCAL_EXPERTS)]
        experts_hit = min(experts_hit, int(local.unique().numel()))
        pairs = min(pairs, int(local.numel()))
    per_expert = 3 * inter * hidden + 4 * (2 * inter // BLOCK + inter // BLOCK) * (hidden // BLOCK)  # fp8 + scales
    routing = t * NUM_EXPERTS * 4 + NUM_EXPERTS * 2
    activations = t * hidden + 4 * t * (hidden // BLOCK) + 2 * t * hidden  # fp8 in, scales, bf16 out
    return {"bytes": routing + activations + experts_hit * per_expert,
            "flops": pairs * (2 * hidden * 2 * inter + 2 * inter * hidden), "compute": "fp8",
            "note": f"{experts_hit} local experts, {pairs} (token, expert) pairs: the fewest of "
                    f"{SOL_ROUTING_DRAWS} routings drawn on the CPU"}


def make_inputs(params: dict, seed: int, device: str) -> tuple:
    """Params: ``T`` tokens (required); ``local_expert_offset`` (default 0, a multiple of 32: the expert-parallel
    rank times 32); ``routed_scaling_factor`` (default 2.5); ``routing``: ``skewed`` (default), ``hot_local`` or
    ``uniform``; ``hidden_size`` / ``intermediate_size`` (defaults 7168 / 2048, multiples of 128; the tests use
    tiny ones)."""
    t = int(params["T"])
    hidden = int(params.get("hidden_size", HIDDEN))
    inter = int(params.get("intermediate_size", INTERMEDIATE))
    offset = int(params.get("local_expert_offset", 0))
    rsf = float(params.get("routed_scaling_factor", 2.5))
    kind = params.get("routing", "skewed")
    if hidden % BLOCK or inter % BLOCK:
        raise ValueError("hidden_size and intermediate_size must be multiples of 128")
    if not 0 <= offset <= NUM_EXPERTS - NUM_LOCAL_EXPERTS:
        raise ValueError(f"local_expert_offset {offset} out of range")
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device)

    routing_bias, logits = draw_routing(t, kind, offset, g, device)

    # Activations after the post-attention RMSNorm: about unit scale per token, a token-dependent gain and a few
    # outlier channels (one per 1024, 20x larger at the real size; fewer channels keep the same share of the
    # variance at smaller test sizes), so the per-token 1x128 block scales differ across blocks.
    x = randn(t, hidden) * torch.exp(0.3 * randn(t, 1))
    n_out = max(1, hidden // 1024)
    outliers = torch.randperm(hidden, generator=g, device=device)[:n_out]
    x[:, outliers] *= 20.0 * math.sqrt(hidden / (1024 * n_out))
    hidden_states, hs_scale = quantize_blocks(x.view(t, 1, hidden), 1, BLOCK)
    hidden_states = hidden_states.view(t, hidden)
    hidden_states_scale = hs_scale.view(t, hidden // BLOCK).t().contiguous()  # [hidden/128, T]
    del x

    # Expert weights: Gaussian with a per-block gain, 1/sqrt(fan_in) scaled, quantised in 128x128 blocks. Drawn one
    # expert at a time to keep the fp32 scratch small (one real gemm1 expert is 117 MB in fp32).
    def expert_weights(rows: int, cols: int):
        qs, scales = [], []
        for _ in range(NUM_LOCAL_EXPERTS):
            gain = torch.exp(0.25 * randn(rows // BLOCK, 1, cols // BLOCK, 1))
            w = (randn(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK) * gain).view(rows, cols) / math.sqrt(cols)
            q, s = quantize_blocks(w, BLOCK, BLOCK)
            qs.append(q)
            scales.append(s)
            del w
        return torch.stack(qs), torch.stack(scales)

    gemm1_weights, gemm1_weights_scale = expert_weights(2 * inter, hidden)  # [32, 2I, H], [32, 2I/128, H/128]
    gemm2_weights, gemm2_weights_scale = expert_weights(hidden, inter)  # [32, H, I], [32, H/128, I/128]
    return (logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
            gemm2_weights, gemm2_weights_scale, offset, rsf)


# --- reference ----------------------------------------------------------------------------------------------------


def _dequant_blocks(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp8 [.., R, C] with scales [.., R/128, C/128] -> fp32 [.., R, C]."""
    s = scale.float().repeat_interleave(BLOCK, dim=-2).repeat_interleave(BLOCK, dim=-1)
    return q.float() * s


def reference(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
              gemm2_weights, gemm2_weights_scale, local_expert_offset, routed_scaling_factor):
    """fp32 throughout: dequantise, route over all 256 experts, run this rank's 32 experts, combine.

    For local expert e (global id local_expert_offset + e) and the tokens that selected it:
    G1 = A W13[e]^T [Tk, 2I]; C = silu(G1[:, I:]) * G1[:, :I]; O = C W2[e]^T [Tk, H]; output += w[token, e] * O.
    Tokens that selected no local expert get a zero row. Output bf16 [T, H].
    """
    t, hidden = hidden_states.shape
    n_local = gemm1_weights.shape[0]
    inter = gemm2_weights.shape[2]
    device = hidden_states.device
    a = hidden_states.float() * hidden_states_scale.float().t().repeat_interleave(BLOCK, dim=1)  # [T, H]
    experts, weights = route(routing_logits, routing_bias, float(routed_scaling_factor))
    out = torch.zeros(t, hidden, dtype=torch.float32, device=device)
    for e in range(n_local):
        hit = experts == int(local_expert_offset) + e  # [T, 8]; at most one hit per token
        tokens = hit.any(-1).nonzero().squeeze(1)
        if tokens.numel() == 0:
            continue
        w13 = _dequant_blocks(gemm1_weights[e], gemm1_weights_scale[e])  # [2I, H]
        w2 = _dequant_blocks(gemm2_weights[e], gemm2_weights_scale[e])  # [H, I]
        g1 = a[tokens] @ w13.t()
        c = torch.nn.functional.silu(g1[:, inter:]) * g1[:, :inter]
        o = c @ w2.t()
        w_tok = (weights * hit).sum(-1)[tokens]
        out.index_add_(0, tokens, o * w_tok[:, None])
    return out.to(torch.bfloat16)
