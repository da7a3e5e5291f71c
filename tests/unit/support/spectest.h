/* spectest.h - helpers for the unit tests that read experiment specs (spec, expand, plan).
 *
 * They assert with cmocka, so they are static inline here rather than in a support .c file
 * (the bench links every support .c file but not cmocka); only test files include this. */
#ifndef HEARTH_SPECTEST_H
#define HEARTH_SPECTEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "spec.h"

/* Parses `text` as the spec file "t.yaml"; any error fails the test with the message and
 * the text.  The caller frees the spec with spec_free. */
static inline spec *spt_parse_ok(const char *text)
{
    spec *s = NULL;
    hearth_err err = {{0}};
    if (spec_parse(&s, "t.yaml", text, strlen(text), &err))
        fail_msg("unexpected error: %s\n--- spec:\n%s", err.msg, text);
    return s;
}

#endif
