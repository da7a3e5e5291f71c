/* device_info.c - device library versions as text and known GPUs' bf16 peaks
 * (device_info.h). */
#include <stdio.h>
#include <string.h>

#include "device_info.h"

const char *device_version_text(char *buf, size_t n, kdev_lib lib, int version)
{
    if (n)
        buf[0] = '\0';
    if (version <= 0 || !n)
        return NULL;
    if (lib == KDEV_LIB_CUDA_RUNTIME)   /* 1000 major + 10 minor */
        snprintf(buf, n, "%d.%d", version / 1000, version % 1000 / 10);
    else                                /* 10000 major + 100 minor + patch */
        snprintf(buf, n, "%d.%d.%d", version / 10000, version % 10000 / 100, version % 100);
    return buf;
}

double device_peak_bf16_tflops(const char *hw_name)
{
    /* the first entry whose every word the name contains: variants before their family */
    static const struct {
        const char *words[2];
        double tflops;
    } known[] = {
        { { "H100", "PCIe" }, 756.0 },
        { { "H100", "NVL" }, 835.0 },
        { { "GH200", NULL }, 989.4 },
        { { "H200", NULL }, 989.4 },
        { { "H100", NULL }, 989.4 },    /* SXM: "NVIDIA H100 80GB HBM3" */
        { { "A100", NULL }, 312.0 },
    };
    if (!hw_name)
        return 0.0;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strstr(hw_name, known[i].words[0]) &&
            (!known[i].words[1] || strstr(hw_name, known[i].words[1])))
            return known[i].tflops;
    return 0.0;
}
