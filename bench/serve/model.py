"""A Llama-3.1-8B-shaped decoder with random weights (no download).

Shape: 32 layers, hidden 4096, 32 query / 8 KV heads of 128, MLP 14336
(SwiGLU), RMSNorm (eps 1e-5), RoPE theta 500000 (plain RoPE: Llama 3.1's
long-context frequency smoothing changes only the angles, not the work),
vocab 128256. Every size is a field of Config so tests run 2 layers of a few
heads on the CPU.

Weights are drawn from a seeded generator on the target device. Their scales
keep activations O(1) through any depth (output projections scaled by
1/sqrt(2 * layers), as GPT-2 does) and make attention peaked (query logits
of std ~3): a wrong page, position or mask then moves the logits far more
than fp16 rounding does, which is what the logits check relies on.

The serving path (Model.forward) runs in the weights' dtype and hands
attention to a backend: attend(layer, q, k, v) appends k / v to the paged
cache and returns the attention output. dense_logits() is the no-cache
reference: whole sequences, causal attention, in float32 (or the model's
dtype, the rounding control of the check).
"""
import dataclasses
import math

import torch
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class Config:
    layers: int = 32
    hidden: int = 4096
    q_heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 14336
    vocab: int = 128256
    rope_theta: float = 500000.0
    eps: float = 1e-5
    max_positions: int = 8192
    q_logit_std: float = 3.0  # std of q.k / sqrt(d) at init: peaked attention (see the module doc)

    @property
    def qkv_dim(self):
        return (self.q_heads + 2 * self.kv_heads) * self.head_dim


LLAMA_8B = Config()


def tiny(layers=2, **kw):
    """A CPU-sized config of the same structure (GQA group 4, head dim 128: the kernels' shape)."""
    base = dict(layers=layers, hidden=256, q_heads=8, kv_heads=2, head_dim=128, intermediate=512, vocab=512,
                max_positions=4096)
    base.update(kw)
    return Config(**base)


def rms_norm(x, w, eps):
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope_tables(cfg, device):
    """cos, sin float32 [max_positions, head_dim / 2]: pair j turns by pos * theta^(-2j / d)."""
    half = cfg.head_dim // 2
    inv = cfg.rope_theta ** (-torch.arange(half, dtype=torch.float64) * 2 / cfg.head_dim)
    ang = torch.arange(cfg.max_positions, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).float().to(device), torch.sin(ang).float().to(device)


def apply_rope(x, cos, sin):
    """Llama RoPE (half-split pairs j, j + d/2) of x [T, H, d] with cos / sin [T, d/2], computed in float32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


class Model:
    def __init__(self, cfg, device="cuda", dtype=torch.float16, seed=0):
        self.cfg, self.device, self.dtype = cfg, torch.device(device), dtype
        g = torch.Generator(device=self.device).manual_seed(seed)
        c = cfg

        def w(*shape, std):
            t = torch.randn(*shape, generator=g, device=self.device, dtype=torch.float32 if
                            self.device.type == "cpu" else dtype)
            return t.mul_(std).to(dtype)

        out_scale = 1.0 / math.sqrt(2 * c.layers)
        self.embed = w(c.vocab, c.hidden, std=1.0)
        self.layers = []
        for _ in range(c.layers):
            wqkv = w(c.qkv_dim, c.hidden, std=1.0 / math.sqrt(c.hidden))
            wqkv[: c.q_heads * c.head_dim].mul_(c.q_logit_std)  # logits q.k / sqrt(d) of std ~q_logit_std
            self.layers.append(dict(
                ln1=torch.ones(c.hidden, device=self.device, dtype=dtype), wqkv=wqkv,
                wo=w(c.hidden, c.q_heads * c.head_dim, std=out_scale / math.sqrt(c.q_heads * c.head_dim)),
                ln2=torch.ones(c.hidden, device=self.device, dtype=dtype),
                wgu=w(2 * c.intermediate, c.hidden, std=1.0 / math.sqrt(c.hidden)),
                wdown=w(c.hidden, c.intermediate, std=out_scale / math.sqrt(c.intermediate))))
        self.norm = torch.ones(c.hidden, device=self.device, dtype=dtype)
        self.lm_head = w(c.vocab, c.hidden, std=1.0 / math.sqrt(c.hidden))
        self.cos, self.sin = rope_tables(c, self.device)

    def nbytes(self):
        n = self.embed.numel() + self.lm_head.numel() + sum(t.numel() for lw in self.layers for t in lw.values())
        return n * self.embed.element_size()

    def forward(self, ids, positions, attn, logit_rows=None, rope_in_model=True):
        """Logits [rows, vocab] (the model's dtype) of one step's tokens.

        ids: int64 [T]; positions: int [T] (RoPE angles); attn: a backend with attend(layer, q, k, v) -> o;
        logit_rows: None (every row) or an int64 index tensor of the rows whose logits are needed;
        rope_in_model: False when the attention backend applies RoPE itself (the Streaming-LLM study).
        """
        c = self.cfg
        T = ids.shape[0]
        h = F.embedding(ids, self.embed)
        if rope_in_model:
            pos = positions.long()
            cos, sin = self.cos[pos], self.sin[pos]
        nq, nkv = c.q_heads * c.head_dim, c.kv_heads * c.head_dim
        for i, lw in enumerate(self.layers):
            x = rms_norm(h, lw["ln1"], c.eps)
            qkv = F.linear(x, lw["wqkv"])
            q = qkv[:, :nq].view(T, c.q_heads, c.head_dim)
            k = qkv[:, nq:nq + nkv].view(T, c.kv_heads, c.head_dim)
            v = qkv[:, nq + nkv:].contiguous().view(T, c.kv_heads, c.head_dim)
            if rope_in_model:
                q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            else:
                q, k = q.contiguous(), k.contiguous()
            o = attn.attend(i, q, k, v)
            h = h + F.linear(o.reshape(T, nq), lw["wo"])
            x = rms_norm(h, lw["ln2"], c.eps)
            g, u = F.linear(x, lw["wgu"]).chunk(2, dim=-1)
            h = h + F.linear(F.silu(g) * u, lw["wdown"])
        if logit_rows is not None:
            h = h.index_select(0, logit_rows)
        return F.linear(rms_norm(h, self.norm, c.eps), self.lm_head)


def _causal_attention(q, k, v, group, exact):
    """q [T, Hq, d], k / v [T, Hkv, d] -> [T, Hq, d], causal. exact: explicit float softmax (the
    float32 reference); else SDPA in the tensors' dtype (the rounding control)."""
    T = q.shape[0]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    if not exact:
        return F.scaled_dot_product_attention(qh[None], kh[None], vh[None], is_causal=True)[0].transpose(0, 1)
    s = torch.einsum("hqd,hkd->hqk", qh, kh) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.einsum("hqk,hkd->hqd", torch.softmax(s, dim=-1), vh).transpose(0, 1)


@torch.no_grad()
def dense_logits(model, sequences, dtype=torch.float32):
    """Logits float32 [len, vocab] of whole sequences (a list of int64 [len] tensors) without a KV cache,
    each layer's weights cast to `dtype` once for all of them (float32: the reference; the model's dtype:
    the rounding control)."""
    c = model.cfg
    exact = dtype == torch.float32
    nq, nkv = c.q_heads * c.head_dim, c.kv_heads * c.head_dim
    hs = [F.embedding(t, model.embed).to(dtype) for t in sequences]
    rot = [(model.cos[:t.shape[0]], model.sin[:t.shape[0]]) for t in sequences]
    for lw in model.layers:
        lw = {k: t.to(dtype) for k, t in lw.items()}
        for i, h in enumerate(hs):
            T = h.shape[0]
            cos, sin = rot[i]
            x = rms_norm(h, lw["ln1"], c.eps)
            qkv = F.linear(x, lw["wqkv"])
            q = apply_rope(qkv[:, :nq].view(T, c.q_heads, c.head_dim), cos, sin)
            k = apply_rope(qkv[:, nq:nq + nkv].view(T, c.kv_heads, c.head_dim), cos, sin)
            v = qkv[:, nq + nkv:].view(T, c.kv_heads, c.head_dim)
            o = _causal_attention(q, k, v, c.q_heads // c.kv_heads, exact)
            h = h + F.linear(o.reshape(T, nq), lw["wo"])
            x = rms_norm(h, lw["ln2"], c.eps)
            g, u = F.linear(x, lw["wgu"]).chunk(2, dim=-1)
            hs[i] = h + F.linear(F.silu(g) * u, lw["wdown"])
    norm, head = model.norm.to(dtype), model.lm_head.to(dtype)
    return [F.linear(rms_norm(h, norm, c.eps), head).float() for h in hs]
