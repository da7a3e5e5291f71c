#!/usr/bin/env python3
"""transformers baseline of contrib/bench/train_gpu.sh: one Qwen2.5-VL training step on one GPU.

The model is transformers' Qwen2_5_VLForConditionalGeneration built from a config with the
dimensions of hearth's preset (contrib/models/qwen2.5-vl-3b.yaml by default, read here, so
both sides train the same shape), random weights (nothing is downloaded), the way its
users train it: fp32 weights under bf16 autocast, attn_implementation="sdpa", fused AdamW
(lr 1e-4, betas 0.9/0.95, weight decay 0.1), global-norm clip 1.0, one sequence per step.
--liger first applies liger-kernel's apply_liger_kernel_to_qwen2_5_vl() (its defaults:
RoPE, RMSNorm, SwiGLU and the fused linear cross-entropy, Triton kernels).

The batch is what Qwen2.5-VL's processor produces for IMAGES images of PX x PX pixels in
a sequence of SEQ tokens: pixel_values [patches, 3 x 2 x 14 x 14] (an image is one
temporal patch: the processor repeats it over temporal_patch frames), image_grid_thw
[IMAGES, 3] = (1, PX/14, PX/14), and input_ids where each image is
<|vision_start|> + (PX/14)^2/4 x <|image_pad|> (merge 2) + <|vision_end|>, the blocks
spread evenly between random text tokens (ids below the special tokens), the attention
mask all ones (and where transformers takes them, mm_token_type_ids: 1 at the image
pads); labels are the input ids with the image pads set to -100 (transformers
shifts them). PX must be a multiple of 28.

Timing: every step is synchronized and timed with perf_counter; ms/step is the median of
the --steps steps after --warmup, tokens/s is SEQ x steps over their summed time (as
hearth's result.json counts it). The encoder's share is the vision tower's forward and
backward (patch embedding, blocks and patch merger: hearth's encoder_ms, which includes
its projector) over the step, median over the steps: CUDA events recorded by hooks, in
the forward from a pre-hook to a post-hook on the vision module, in the backward from the
moment the gradient of the merger's output is computed (a tensor hook) to the moment the
patch embedding's weight gradient is accumulated (the last op of the encoder backward;
register_post_accumulate_grad_hook, torch >= 2.1).

FLOPs are hearth's analytic count (trainer/shape/shape_count.c, shape_count_flops, and
trainer/summary.c), recomputed here from the same preset: forward + backward = 3 x forward,
matmul weights and attention scores only, the causal mask not halved:
    decoder per token   6 x (L x (h (q + 2 kv) + q h + 3 h ffn) + vocab h) + 12 x L x q x SEQ
    encoder per patch   6 x (h x 3*2*14*14 + L x (4 h^2 + 3 h ffn)) + 12 x n_window x q x (window_px/14)^2
    encoder per patch^2 12 x n_full x q        (an image of N patches: N and N^2 times these)
    projector per patch 6 x (4 h_enc x h_proj + h_proj x h_dec) / 4
(q, kv: heads x head_dim, kv_heads x head_dim). MFU = FLOPs of the step / time over --peak
TFLOP/s (default 989: the dense bf16 peak of the H100 SXM; the H200 has the same).

Peak memory: torch.cuda.max_memory_allocated over the timed steps (the CPU: the process's
max RSS). A torch.cuda.OutOfMemoryError is reported, not raised.

Prints a short table and one machine-readable line, which train_gpu.sh reads:
    RESULT <name> <ms/step> <tokens/s> <MFU %> <peak GiB> <encoder share %>
or, where the step did not run, RESULT <name> OOM|no-liger|failed - - - - (the reason on
the line before). --tiny scales the model down (2+2 layers, narrow, a vocabulary of 4096)
to test the script
on a CPU: python3 contrib/bench/vlm_transformers.py --device cpu --tiny --seq 256 --px 56.
"""
import argparse
import importlib.util
import inspect
import os
import resource
import statistics
import sys
import time

import torch
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
PRESET = os.path.join(HERE, "..", "models", "qwen2.5-vl-3b.yaml")
# Qwen2.5-VL's special tokens, as offsets from <|image_pad|> (the preset's image_token_id):
# <|endoftext|> (text tokens are drawn below it), <|im_end|>, <|vision_start|>, <|vision_end|>.
FIRST_SPECIAL, EOS, VISION_START, VISION_END = -12, -10, -3, -2


def load_preset(path, tiny):
    with open(path) as f:
        p = yaml.safe_load(f)
    if tiny:
        p["encoder"].update(layers=2, hidden=64, heads=2, kv_heads=2, head_dim=32, ffn=128,
                            full_attn=[1])
        p["projector"]["hidden"] = 4 * 64
        # A vocabulary of 4096 with the special tokens moved down with it.
        d = p["decoder"]
        shift = d["vocab"] - 4096
        d.update(layers=2, hidden=128, heads=4, kv_heads=2, head_dim=32, ffn=256,
                 mrope_section=[4, 6, 6], vocab=4096, image_token_id=d["image_token_id"] - shift)
    return p


def hf_config_dict(p):
    """The preset as a Hugging Face config.json of Qwen2.5-VL (text keys at the top, as the
    published checkpoints have them: every transformers version with the model reads it)."""
    e, pr, d = p["encoder"], p["projector"], p["decoder"]
    # Fields transformers' Qwen2.5-VL has no switch for must hold what it hard-codes.
    assert e["mlp"] == "swiglu" and e["norm"] == "rmsnorm" and e["pos"] == "rope2d"
    assert e["head_dim"] * e["heads"] == e["hidden"] and e["kv_heads"] == e["heads"]
    assert pr["hidden"] == e["hidden"] * e["spatial_merge"] ** 2
    assert d["mlp"] == "swiglu" and d["norm"] == "rmsnorm" and d["pos"] == "mrope"
    assert d["head_dim"] * d["heads"] == d["hidden"]
    assert sum(d["mrope_section"]) * 2 == d["head_dim"]
    assert e["window_px"] % (e["patch"] * e["spatial_merge"]) == 0
    img = d["image_token_id"]
    return {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        "vocab_size": d["vocab"],
        "hidden_size": d["hidden"],
        "intermediate_size": d["ffn"],
        "num_hidden_layers": d["layers"],
        "num_attention_heads": d["heads"],
        "num_key_value_heads": d["kv_heads"],
        "hidden_act": "silu",
        "max_position_embeddings": d["max_positions"],
        "rms_norm_eps": float(d["norm_eps"]),
        "rope_theta": float(d["rope_theta"]),
        "rope_scaling": {"type": "mrope", "mrope_section": list(d["mrope_section"])},
        "tie_word_embeddings": bool(d["tied_embeddings"]),
        "use_sliding_window": False,
        "use_cache": False,
        "attention_dropout": 0.0,
        "bos_token_id": img + FIRST_SPECIAL,
        "eos_token_id": img + EOS,
        "vision_start_token_id": img + VISION_START,
        "vision_end_token_id": img + VISION_END,
        "image_token_id": img,
        "video_token_id": img + 1,
        "vision_config": {
            "depth": e["layers"],
            "hidden_size": e["hidden"],
            "hidden_act": "silu",
            "intermediate_size": e["ffn"],
            "num_heads": e["heads"],
            "in_chans": e["in_channels"],
            "in_channels": e["in_channels"],
            "out_hidden_size": d["hidden"],
            "patch_size": e["patch"],
            "spatial_patch_size": e["patch"],
            "spatial_merge_size": e["spatial_merge"],
            "temporal_patch_size": e["temporal_patch"],
            "window_size": e["window_px"],
            "fullatt_block_indexes": list(e["full_attn"]),
            "tokens_per_second": 2,
        },
    }


def step_flops(p, seq, images, px):
    """hearth's analytic FLOPs of one step of one sequence (shape_count_flops, summary.c)."""
    e, pr, d = p["encoder"], p["projector"], p["decoder"]

    def attn_weights(s):
        h, q, kv = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
        return h * (q + 2 * kv) + q * h

    def mlp_weights(s):
        return (3 if s["mlp"] == "swiglu" else 2) * s["hidden"] * s["ffn"]

    w = d["layers"] * (attn_weights(d) + mlp_weights(d)) + d["vocab"] * d["hidden"]
    dec_tok = 6.0 * w + 12.0 * d["layers"] * d["heads"] * d["head_dim"] * seq
    patch_dim = e["in_channels"] * e["temporal_patch"] * e["patch"] ** 2
    ew = e["hidden"] * patch_dim + e["layers"] * (attn_weights(e) + mlp_weights(e))
    eq = e["heads"] * e["head_dim"]
    n_full = len(e["full_attn"]) if e["window_px"] > 0 else e["layers"]
    side = e["window_px"] / e["patch"]
    enc_patch = 6.0 * ew + 12.0 * (e["layers"] - n_full) * eq * side * side
    enc_patch_sq = 12.0 * n_full * eq
    merge2 = e["spatial_merge"] ** 2
    proj_patch = 6.0 * (merge2 * e["hidden"] * pr["hidden"] + pr["hidden"] * d["hidden"]) / merge2
    n = (px // e["patch"]) ** 2
    return seq * dec_tok + images * n * (enc_patch + proj_patch) + images * n * n * enc_patch_sq


def wants_token_types():
    """Whether this transformers' model takes mm_token_type_ids (its processor returns them:
    0 text, 1 image; without them transformers 5 gives every token 1-D positions)."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as mq
    model = getattr(mq, "Qwen2_5_VLModel", None)
    return model is not None and "mm_token_type_ids" in inspect.signature(model.forward).parameters


def make_batch(p, cfg, seq, images, px, dev, gen):
    """One sequence as Qwen2.5-VL's processor lays it out (see the module's docstring)."""
    e = p["encoder"]
    unit = e["patch"] * e["spatial_merge"]
    if px % unit:
        sys.exit(f"--px {px}: must be a multiple of {unit} (patch x merge)")
    g = px // e["patch"]
    n_tok = g * g // e["spatial_merge"] ** 2
    n_text = seq - images * (n_tok + 2)
    if n_text < 1:
        sys.exit(f"--seq {seq} cannot hold {images} images of {n_tok} tokens (+2 each)")
    img = cfg.image_token_id
    text = torch.randint(0, img + FIRST_SPECIAL, (n_text,), generator=gen)
    # images + 1 text runs around the image blocks, as even as integer division allows
    cuts = [round(n_text * i / (images + 1)) for i in range(images + 2)]
    parts = []
    for i in range(images + 1):
        parts.append(text[cuts[i]:cuts[i + 1]])
        if i < images:
            parts.append(torch.tensor([img + VISION_START] + [img] * n_tok + [img + VISION_END]))
    ids = torch.cat(parts).unsqueeze(0)
    assert ids.shape[1] == seq
    labels = ids.clone()
    labels[ids == cfg.image_token_id] = -100
    batch = {"input_ids": ids.to(dev), "attention_mask": torch.ones_like(ids).to(dev),
             "labels": labels.to(dev)}
    if wants_token_types():  # transformers 5 places mRoPE positions by these
        batch["mm_token_type_ids"] = (ids == img).int().to(dev)
    if images:
        patch_dim = e["in_channels"] * e["temporal_patch"] * e["patch"] ** 2
        batch["pixel_values"] = torch.randn(images * g * g, patch_dim, generator=gen).to(dev)
        batch["image_grid_thw"] = torch.tensor([[1, g, g]] * images, dtype=torch.long).to(dev)
    return batch, images * g * g


class EncoderTimer:
    """CUDA events around the vision tower's forward and backward (module docstring)."""

    def __init__(self, model):
        visual = None
        for name, mod in model.named_modules():
            if name.split(".")[-1] == "visual":
                visual = mod
                break
        assert visual is not None, "no vision tower ('visual') in the model"
        self.cuda = next(model.parameters()).is_cuda
        self.clock = {}
        visual.register_forward_pre_hook(lambda m, a: self.mark("fwd0"))
        visual.register_forward_hook(lambda m, a, o: self.mark("fwd1"))
        visual.merger.register_forward_hook(self.on_merger)
        w = visual.patch_embed.proj.weight
        if hasattr(w, "register_post_accumulate_grad_hook"):
            w.register_post_accumulate_grad_hook(lambda t: self.mark("bwd1"))
        else:
            print("# torch < 2.1: the encoder backward is timed to the end of backward()")

    def mark(self, key):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.clock[key] = ev
        else:
            self.clock[key] = time.perf_counter()

    def on_merger(self, mod, args, out):
        if out.requires_grad:
            out.register_hook(lambda g: self.mark("bwd0"))

    def span(self, a, b):
        x, y = self.clock[a], self.clock[b]
        return x.elapsed_time(y) if self.cuda else (y - x) * 1e3

    def step_ms(self):
        """The encoder's forward + backward ms of the step just synchronized (0 if none)."""
        c = self.clock
        if "fwd0" not in c:
            return 0.0
        ms = self.span("fwd0", "fwd1")
        if "bwd0" in c:
            ms += self.span("bwd0", "bwd1" if "bwd1" in c else "end")
        return ms


def build_model(cfg_dict, dev):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    cfg = Qwen2_5_VLConfig.from_dict(dict(cfg_dict))
    # Random weights, initialised on the device itself (3.8 B of them).
    with torch.device(dev):
        model = Qwen2_5_VLForConditionalGeneration._from_config(cfg, attn_implementation="sdpa")
    model = model.to(device=dev, dtype=torch.float32)
    model.train()
    return cfg, model


def run(a, name, p):
    dev = a.device
    if a.liger:
        if importlib.util.find_spec("liger_kernel") is None:
            print("# liger-kernel not installed (pip install liger-kernel)")
            return f"RESULT {name} no-liger - - - -", 0
        # An ImportError here (a liger-kernel that does not match this transformers) is
        # reported as the row's failure.
        from liger_kernel.transformers import apply_liger_kernel_to_qwen2_5_vl
        apply_liger_kernel_to_qwen2_5_vl()
    torch.manual_seed(1234)
    cfg, model = build_model(hf_config_dict(p), dev)
    if a.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    n_params = sum(t.numel() for t in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, **({"fused": True} if dev == "cuda" else {}))
    gen = torch.Generator().manual_seed(5)
    batch, patches = make_batch(p, cfg, a.seq, a.images, a.px, dev, gen)
    n_img_tok = int((batch["input_ids"] == cfg.image_token_id).sum())
    timer = EncoderTimer(model)
    flops = step_flops(p, a.seq, a.images, a.px)
    print(f"# {name}: {n_params:,} parameters, seq {a.seq} with {a.images} images of "
          f"{a.px}x{a.px} ({patches} patches, {n_img_tok} image tokens), "
          f"{flops / a.seq / 1e9:.3f} GFLOP/token, MFU over {a.peak:g} TFLOP/s")

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    def step():
        timer.clock.clear()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev, dtype=torch.bfloat16):
            out = model(**batch, use_cache=False)
        out.loss.backward()
        timer.mark("end")
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return out.loss.detach()

    losses, times, enc = [], [], []
    for i in range(a.warmup + a.steps):
        if i == a.warmup and dev == "cuda":
            torch.cuda.reset_peak_memory_stats()
        sync()
        t0 = time.perf_counter()
        loss = step()
        sync()
        ms = (time.perf_counter() - t0) * 1e3
        losses.append(loss.item())
        if i >= a.warmup:
            times.append(ms)
            enc.append(timer.step_ms() / ms)
    ms = statistics.median(times)
    tok_s = a.seq * len(times) / (sum(times) / 1e3)
    mfu = 100.0 * flops / a.seq * tok_s / (a.peak * 1e12)
    if dev == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**30
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
    share = 100.0 * statistics.median(enc)
    print(f"# loss {losses[0]:.4f} -> {losses[-1]:.4f}; step ms {' '.join(f'{t:.1f}' for t in times)}")
    print(f"{'':14s} {'ms/step':>10s} {'tokens/s':>10s} {'MFU %':>7s} {'peak GiB':>9s} {'encoder':>8s}")
    print(f"{name:14s} {ms:10.1f} {tok_s:10.0f} {mfu:7.2f} {peak:9.2f} {share:7.1f}%")
    return f"RESULT {name} {ms:.1f} {tok_s:.0f} {mfu:.2f} {peak:.2f} {share:.1f}", 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--px", type=int, default=448)
    ap.add_argument("--text-only", action="store_true", help="no images (--images 0)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--liger", action="store_true", help="apply liger-kernel's Qwen2.5-VL kernels")
    ap.add_argument("--grad-ckpt", action="store_true",
                    help="transformers' gradient checkpointing (not the default baseline)")
    ap.add_argument("--peak", type=float, default=989, help="bf16 peak TFLOP/s for MFU")
    ap.add_argument("--preset", default=PRESET, help="hearth model preset (YAML)")
    ap.add_argument("--tiny", action="store_true", help="a 2+2-layer narrow model (CPU tests)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--name", default="")
    a = ap.parse_args()
    if a.text_only:
        a.images = 0
    name = a.name or ("liger" if a.liger else "transformers")
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    import transformers
    print(f"# torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.cuda.get_device_name() if a.device == 'cuda' else 'cpu'}")
    p = load_preset(a.preset, a.tiny)
    rc = 1
    try:
        line, rc = run(a, name, p)
    except torch.cuda.OutOfMemoryError as ex:
        peak = torch.cuda.max_memory_allocated() / 2**30 if a.device == "cuda" else 0.0
        print(f"# {name}: out of memory (max allocated {peak:.2f} GiB): "
              f"{str(ex).splitlines()[0]}")
        line, rc = f"RESULT {name} OOM - - - -", 0
    except Exception as ex:  # reported as a row of the table, the traceback on stderr
        import traceback
        traceback.print_exc()
        print(f"# {name}: failed: {type(ex).__name__}: {str(ex).splitlines()[0] if str(ex) else ''}")
        line = f"RESULT {name} failed - - - -"
    print(line)
    sys.exit(rc)


if __name__ == "__main__":
    main()
