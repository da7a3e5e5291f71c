/* fuzz_run_config.c - libFuzzer target: the run-config reader (trainer/shape/run_config.h).
 * The input is the YAML text of a run config, parsed with presets (found through
 * $HEARTH_MODELS or beside the binary, as hearth-train finds them), defaults and the
 * layout rules; an accepted config is also turned into canonical JSON and hashed. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shape/run_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* run_config_parse takes a C string. */
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    run_config *c = calloc(1, sizeof *c);
    hearth_err err = { { 0 } };
    if (c && run_config_parse(c, "fuzz.yaml", text, NULL, 0, 0, &err) == 0) {
        char *json = run_config_canonical_json(c, &err);
        free(json);
        char hex[65];
        run_config_hash(c, hex, &err);
    }
    free(c);
    free(text);
    return 0;
}
