/* bench_layers.h - hearth-train --bench-layers: the layer benchmark of a run's model
 * (docs/select.md, "Layer benchmarks").
 *
 * For each linear kind of the model (fp8_linears.h: the shapes of one rank's shard at the
 * run's tp) and a few token counts around the micro batch's (1/4, 1/2, 1, 2 times it),
 * times forward + backward through the device interface: the device's own GEMMs (the
 * baseline: bf16 on cuda, the fp32 reference on the cpu) against the model's FP8 linear
 * (model/fp8.h, quantisation included), the median of several repeats on fresh random
 * inputs, and measures the FP8 result's relative error against the baseline.  Writes
 * DIR/layer_bench.json atomically, prints a progress line per kind (stderr) and a table
 * (out).  Trains nothing.
 *
 * On the cpu the FP8 path is an emulation around the fp32 GEMM: its times say nothing
 * about a GPU (the file says device "cpu", and selection warns). */
#ifndef HEARTH_BENCH_LAYERS_H
#define HEARTH_BENCH_LAYERS_H

#include <stdio.h>

#include "cli.h"

/* Loads the config of `a` (--config, --set), benchmarks, writes a->out_dir/layer_bench.json.
 * Messages go to errf as "hearth-train: MESSAGE".  Returns the exit status: 0, 2 for a
 * usage or config error, 1 for anything else. */
int bench_layers_main(const cli_args *a, FILE *out, FILE *errf);

#endif
