/* device_info.h - what result.json and layer_bench.json say about a device beyond its
 * name: its libraries' versions as text, and the dense bf16 peak of the GPUs we know (the
 * denominator of MFU). */
#ifndef HEARTH_DEVICE_INFO_H
#define HEARTH_DEVICE_INFO_H

#include <stddef.h>

#include "kdev.h"

/* buf = the version as text ("13.0" for the CUDA runtime's 13000, "13.1.0" for cuBLASLt's
 * 130100); returns buf, or NULL (buf "") when version is 0 (no such library). */
const char *device_version_text(char *buf, size_t n, kdev_lib lib, int version);

/* The dense (no sparsity) bf16 tensor-core peak in TFLOP/s of the GPU that kdev_hw_name
 * calls hw_name, from NVIDIA's datasheets (H100 SXM 989, H100 NVL 835, H100 PCIe 756,
 * H200 and GH200 989, A100 312); 0 for a device we do not know (the cpu among them). */
double device_peak_bf16_tflops(const char *hw_name);

#endif
