/* canon_json.h - canonical JSON text of a jansson value: object keys sorted by byte
 * value (strcmp), no whitespace, integers in decimal, reals in the shortest text that
 * reads back as the same double (a ".0" added to integral values), strings with only
 * '"', '\\' and control characters escaped (UTF-8 kept as is).  Equal values give
 * byte-identical text; that text is what the config hash is computed over.
 *
 * Ownership: returns a malloc'd string the caller frees, or NULL when out of memory. */
#ifndef HEARTH_CANON_JSON_H
#define HEARTH_CANON_JSON_H

#include <jansson.h>

char *canon_json_dump(const json_t *v);

#endif
