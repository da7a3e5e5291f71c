#!/usr/bin/env python3
"""Writes tests/data/st_fixture.safetensors with the Hugging Face safetensors library, so
that test_safetensors reads a file our writer did not make.  Values are fixed formulas
(test_safetensors.c computes the same ones):
  f32    F32  [2, 3]  i * 0.25 - 1
  bf16   BF16 [4]     (i + 1) / 3 in fp32, negated for odd i, rounded by torch
  f16    F16  [2, 2]  the same values as bf16
  i64    I64  [3]     i * 1000000007 - 5
  scalar F32  []      7.5
  metadata: format = "pt", source = "make_st_fixture.py"

  make_st_fixture.py [OUT]   (default tests/data/st_fixture.safetensors)
"""
import sys

import torch
from safetensors.torch import save_file


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/st_fixture.safetensors"
    i4 = torch.arange(4, dtype=torch.float32)
    thirds = (i4 + 1) / 3
    thirds = torch.where(torch.arange(4) % 2 == 1, -thirds, thirds)
    tensors = {
        "f32": (torch.arange(6, dtype=torch.float32) * 0.25 - 1).reshape(2, 3),
        "bf16": thirds.to(torch.bfloat16),
        "f16": thirds.to(torch.float16).reshape(2, 2),
        "i64": torch.arange(3, dtype=torch.int64) * 1000000007 - 5,
        "scalar": torch.tensor(7.5, dtype=torch.float32),
    }
    save_file(tensors, out, metadata={"format": "pt", "source": "make_st_fixture.py"})


if __name__ == "__main__":
    main()
