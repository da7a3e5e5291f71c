/* fuzz_safetensors.c - libFuzzer target: the safetensors reader (trainer/safetensors.h).
 * The input is a whole safetensors file (8-byte header length, JSON header, data).  It is
 * put into an anonymous in-memory file (memfd) and opened through /proc/self/fd, so that
 * st_file_open runs exactly as on disk (fstat, mmap, header checks) without touching the
 * file system.  An accepted file's tensors are looked up and converted, which reads every
 * byte the header claims. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "safetensors.h"

static void fuzz_read_tensors(const st_file *f)
{
    hearth_err err = { { 0 } };
    for (int i = 0; i < st_file_count(f); i++) {
        const st_tensor *t = st_file_at(f, i);
        if (st_file_find(f, t->name) != t)
            abort();   /* names are unique: the lookup must give the same tensor */
        if (t->numel > (1u << 20))
            continue;
        float *out = malloc(t->numel ? t->numel * sizeof *out : 1);
        if (!out)
            continue;
        st_tensor_to_f32(t, out, t->numel, &err);
        free(out);
    }
    st_file_metadata(f, "format");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
    if (fd < 0)
        return 0;
    size_t done = 0;
    while (done < size) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0)
            break;
        done += (size_t)w;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    st_file *f = NULL;
    hearth_err err = { { 0 } };
    if (done == size && st_file_open(&f, path, &err) == 0) {
        fuzz_read_tensors(f);
        st_file_close(f);
    }
    close(fd);
    return 0;
}
