/* fuzz_spec.c - libFuzzer target: the experiment spec reader (orchestrator/spec.h).
 * The input is the YAML text of a spec; spec_parse must either accept it or fail with a
 * message, and free everything in both cases. */
#include <stddef.h>
#include <stdint.h>

#include "spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    spec *s = NULL;
    hearth_err err = { { 0 } };
    if (spec_parse(&s, "fuzz.yaml", (const char *)data, size, &err) == 0)
        spec_free(s);
    return 0;
}
