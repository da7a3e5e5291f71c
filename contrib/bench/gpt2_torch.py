#!/usr/bin/env python3
"""PyTorch baseline of contrib/bench/train_gpu.sh: one GPT-2 (124M shape) training step on
one GPU.

The same model as hearth-train's gpt2-124m preset: learned positions, pre-LayerNorm
blocks with biases, GELU (tanh) MLP, LM head tied to the token embedding, mean
cross-entropy over next-token targets (the last position of each sequence has none),
global-norm clip 1.0, AdamW (fused; lr 6e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on
matrices and embeddings) on fp32 parameters under bf16 autocast, attention through
F.scaled_dot_product_attention (flash) and the whole model under torch.compile.

Prints a short table and one machine-readable line, which train_gpu.sh reads:
    RESULT torch <tok/s> <ms/step> <MFU %> <peak GiB> <loss first> <loss last>
MFU counts FLOPs as the standalone GPU step did (6 x linear weights per token + 12 x L x C x T for
attention) over --peak TFLOP/s (741: the measured bf16 GEMM peak of the H200).
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H, Fh):
        super().__init__()
        self.H = H
        self.ln1 = nn.LayerNorm(C, eps=1e-5)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C, eps=1e-5)
        self.fc1 = nn.Linear(C, Fh)
        self.fc2 = nn.Linear(Fh, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, C))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, C, H, Fh, V, P):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(P, C)
        self.blocks = nn.ModuleList(Block(C, H, Fh) for _ in range(L))
        self.lnf = nn.LayerNorm(C, eps=1e-5)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("proj.weight", "fc2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.lnf(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1),
                               ignore_index=-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--ffn", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--micro", type=int, default=0)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--peak", type=float, default=741)
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    Fh = a.ffn or 4 * a.hidden
    micro = a.micro or a.batch
    assert a.batch % micro == 0
    n_micro = a.batch // micro

    torch.manual_seed(1234)
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = "cuda"
    model = GPT(a.layers, a.hidden, a.heads, Fh, a.vocab, max(1024, a.seq)).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    nodecay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": nodecay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = model if a.no_compile else torch.compile(model)

    g = torch.Generator(device="cpu").manual_seed(5)
    batches = []
    for _ in range(n_micro):
        t = torch.randint(0, a.vocab, (micro, a.seq + 1), generator=g)
        tgt = t[:, 1:].clone()
        tgt[:, -1] = -1
        batches.append((t[:, :-1].contiguous().to(dev), tgt.to(dev)))

    def step():
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for idx, tgt in batches:
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = fwd(idx, tgt) / n_micro
            loss.backward()
            total = total + loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return total

    loss_first = step().item()
    for _ in range(a.warmup - 1):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        last = step()
    loss_last = last.item()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3 / a.steps

    L, C, V, T = a.layers, a.hidden, a.vocab, a.seq
    flops_tok = 6.0 * (L * (4 * C * C + 2 * C * Fh) + V * C) + 12.0 * L * C * T
    tok_s = a.batch * a.seq / (ms / 1e3)
    mfu = 100.0 * flops_tok * tok_s / (a.peak * 1e12)
    peak_gib = torch.cuda.max_memory_allocated() / 2**30
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}, "
          f"{'eager' if a.no_compile else 'torch.compile'}, B {a.batch} x T {a.seq} "
          f"({n_micro} micro batches of {micro}); loss {loss_first:.4f} -> {loss_last:.4f}")
    print(f"{'':10s} {'ms/step':>10s} {'tokens/s':>12s} {'MFU':>8s} {'peak GiB':>10s}")
    print(f"{'torch':10s} {ms:10.2f} {tok_s:12.0f} {mfu:7.1f}% {peak_gib:10.2f}")
    print(f"RESULT torch {tok_s:.0f} {ms:.2f} {mfu:.1f} {peak_gib:.2f} {loss_first:.4f} {loss_last:.4f}")


if __name__ == "__main__":
    main()
