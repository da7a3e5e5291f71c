/* fuzz_shard.c - libFuzzer target: the data-set shard reader (trainer/shard_format.h), as
 * data_shards.c uses it.  An input that starts with '{' is a data set's manifest.json,
 * written into a scratch directory and read with shard_manifest_read; any other input is
 * a mapped shard: the header and index are checked against the input's size, then every
 * record is parsed and its tokens, grids and pixels are read. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shard_format.h"

/* The scratch directory of this fuzzing process (removed at exit). */
static char fuzz_dir[64];
static char fuzz_manifest[128];

static void fuzz_cleanup(void)
{
    unlink(fuzz_manifest);
    rmdir(fuzz_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *tmp = getenv("TMPDIR");
    snprintf(fuzz_dir, sizeof fuzz_dir, "%.40s/fuzz-shard.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(fuzz_dir))
        abort();
    snprintf(fuzz_manifest, sizeof fuzz_manifest, "%s/" SHARD_MANIFEST_NAME, fuzz_dir);
    atexit(fuzz_cleanup);
    return 0;
}

static void fuzz_manifest_read(const uint8_t *data, size_t size)
{
    FILE *f = fopen(fuzz_manifest, "wb");
    if (!f)
        abort();
    if (fwrite(data, 1, size, f) != size)
        abort();
    fclose(f);
    shard_manifest m;
    hearth_err err = { { 0 } };
    shard_manifest_read(&m, fuzz_dir, &err);
    shard_manifest_free(&m);
}

/* Reads every byte a record points at (so ASan sees any read outside the input). */
static unsigned fuzz_touch(const shard_record *r, const shard_header *h)
{
    unsigned acc = 0;
    for (uint32_t i = 0; i < r->n_tokens; i++)
        acc += (unsigned)r->tokens[i];
    size_t px = 0;
    for (uint32_t i = 0; i < r->n_images; i++) {
        acc += r->grids[2 * i] + r->grids[2 * i + 1];
        px += (size_t)r->grids[2 * i] * (size_t)r->grids[2 * i + 1] * (size_t)h->patch *
              (size_t)h->patch * h->channels;
    }
    for (size_t i = 0; i < px; i++)
        acc += r->pixels[i];
    return acc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 0 && data[0] == '{') {
        fuzz_manifest_read(data, size);
        return 0;
    }
    /* A mapped shard starts page-aligned: give the reader an 8-aligned copy, as mmap does. */
    unsigned char *file = malloc(size ? size : 1);
    if (!file)
        return 0;
    memcpy(file, data, size);
    shard_header h;
    hearth_err err = { { 0 } };
    volatile unsigned sink = 0;
    if (shard_header_check(&h, file, size, "fuzz.bin", &err) == 0) {
        for (uint64_t r = 0; r < h.n_records; r++) {
            shard_record rec;
            if (shard_record_get(&rec, file, &h, r, "fuzz.bin", &err) == 0)
                sink += fuzz_touch(&rec, &h);
        }
    }
    (void)sink;
    free(file);
    return 0;
}
