#!/usr/bin/env python3
"""Reference outputs of a small random Qwen2.5-VL from Hugging Face transformers, for
hearth-train's checkpoint parity tests (not part of the product).

  qwen_parity.py make DIR [--seed S]
      builds a small random Qwen2_5_VLForConditionalGeneration (fp32, eager attention,
      weights rounded to bf16 so that the bf16 checkpoint holds them exactly), saves it to
      DIR with save_pretrained (bf16 safetensors + config.json), and writes
      DIR/parity.safetensors: input_ids [1, S] (I64), labels [1, S] (I64, -100 = no loss),
      pixel_values [patches, C*T*P*P] (F32), image_grid_thw [images, 3] (I64),
      logits [S, V] (F32) and loss [] (F32) of transformers' forward.
  qwen_parity.py check DIR PARITY [--tol 1e-4]
      loads DIR (e.g. written by `hearth-train --export-hf DIR`) with transformers in fp32,
      runs the inputs of PARITY and compares logits and loss with the ones stored there;
      exits 1 when the worst relative difference exceeds --tol.
"""
import argparse
import inspect
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

IMAGE_TOKEN = 300   # vision_start = image - 3, vision_end = image - 2, video = image + 1


def tiny_config():
    return Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
            max_position_embeddings=1024, tie_word_embeddings=True,
            rope_parameters=dict(rope_type="default", mrope_section=[2, 3, 3],
                                 rope_theta=1000000.0)),
        vision_config=dict(
            depth=4, hidden_size=32, intermediate_size=48, num_heads=2, in_channels=3,
            patch_size=4, temporal_patch_size=2, spatial_merge_size=2, window_size=16,
            fullatt_block_indexes=[1, 3], out_hidden_size=64, hidden_act="silu"),
        image_token_id=IMAGE_TOKEN, video_token_id=IMAGE_TOKEN + 1,
        vision_start_token_id=IMAGE_TOKEN - 3, vision_end_token_id=IMAGE_TOKEN - 2,
        tie_word_embeddings=True)


def make_inputs(cfg, gen):
    vc = cfg.vision_config
    m2 = vc.spatial_merge_size ** 2
    # a 6x10 patch image (3x5 merge units: windows of 2x2 units do not divide it), a 4x4
    grids = [(1, 6, 10), (1, 4, 4)]
    ids = []
    def text(n):
        ids.extend(torch.randint(0, IMAGE_TOKEN - 3, (n,), generator=gen).tolist())
    text(5)
    for t, h, w in grids:
        ids.append(IMAGE_TOKEN - 3)
        ids.extend([IMAGE_TOKEN] * (t * h * w // m2))
        ids.append(IMAGE_TOKEN - 2)
        text(6)
    input_ids = torch.tensor([ids], dtype=torch.long)
    labels = input_ids.clone()
    labels[input_ids == IMAGE_TOKEN] = -100
    pdim = vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2
    n_patches = sum(t * h * w for t, h, w in grids)
    pixels = torch.randn(n_patches, pdim, generator=gen)
    return input_ids, labels, pixels, torch.tensor(grids, dtype=torch.long)


def forward(model, input_ids, labels, pixels, grid):
    # transformers 5 takes the multimodal RoPE layout from mm_token_type_ids (1 = image),
    # which its processor makes; without it every token gets text positions
    kw = {}
    if "mm_token_type_ids" in inspect.signature(model.forward).parameters:
        kw["mm_token_type_ids"] = (input_ids == IMAGE_TOKEN).int()
    with torch.no_grad():
        out = model(input_ids=input_ids, labels=labels, pixel_values=pixels,
                    image_grid_thw=grid, **kw)
    return out.logits[0].float(), out.loss.float()


def cmd_make(a):
    torch.manual_seed(a.seed)
    cfg = tiny_config()
    model = Qwen2_5_VLForConditionalGeneration(cfg).float().eval()
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        for p in model.parameters():
            # healthy random values (not the 0.02 init, which leaves the encoder's share of
            # the output within rounding), exactly representable in bf16
            p.copy_((torch.randn_like(p) * (0.3 if p.dim() > 1 else 0.2) +
                     (1.0 if p.dim() == 1 else 0.0)).to(torch.bfloat16).float())
    gen = torch.Generator().manual_seed(a.seed + 1)
    input_ids, labels, pixels, grid = make_inputs(cfg, gen)
    logits, loss = forward(model, input_ids, labels, pixels, grid)
    model.to(torch.bfloat16).save_pretrained(a.dir, safe_serialization=True)
    save_file({"input_ids": input_ids, "labels": labels, "pixel_values": pixels.contiguous(),
               "image_grid_thw": grid, "logits": logits.contiguous(),
               "loss": loss.reshape(())}, f"{a.dir}/parity.safetensors",
              metadata={"format": "pt"})
    print(f"wrote {a.dir}: {sum(p.numel() for p in model.parameters())} parameters, "
          f"{input_ids.shape[1]} tokens, loss {loss.item():.6f}")


def cmd_check(a):
    ref = load_file(a.parity)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(
        a.dir, dtype=torch.float32, attn_implementation="eager").eval()
    logits, loss = forward(model, ref["input_ids"], ref["labels"], ref["pixel_values"],
                           ref["image_grid_thw"])
    dl = ((logits - ref["logits"]).norm() / ref["logits"].norm()).item()
    dloss = abs(loss.item() - ref["loss"].item()) / abs(ref["loss"].item())
    print(f"logits relative L2 {dl:.3e}, loss {loss.item():.7f} vs {ref['loss'].item():.7f} "
          f"(relative {dloss:.3e})")
    sys.exit(0 if dl <= a.tol and dloss <= a.tol else 1)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--seed", type=int, default=1234)
    c = sub.add_parser("check")
    c.add_argument("dir")
    c.add_argument("parity")
    c.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    cmd_make(a) if a.cmd == "make" else cmd_check(a)


if __name__ == "__main__":
    main()
