/* test_config_hash.c - the resolved config's canonical JSON and sha256 config hash:
 * equal for configs that differ only in spelling, different after any change of a value;
 * the JSON is sorted, compact, complete, and its numbers are the shortest round-trip
 * text.  Random choices from a fresh seed (printed on failure). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <float.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shape/canon_json.h"
#include "shape/fields.h"
#include "shape/run_config.h"
#include "shape/shape_internal.h"
#include "support/testutil.h"

static int parse(run_config *c, const char *yaml, const char *const *sets, hearth_err *err)
{
    config_override o[32] = { { 0 } };
    int n = 0;
    for (; sets && sets[n]; n++) {
        o[n].key = sets[n];
        o[n].value = NULL;
    }
    return run_config_parse(c, "run.yaml", yaml, o, n, 0, err);
}

static void parse_ok(run_config *c, const char *yaml, const char *const *sets, uint64_t seed)
{
    hearth_err err = { { 0 } };
    if (parse(c, yaml, sets, &err))
        fail_msg("%s (seed %llu)\n%s", err.msg, (unsigned long long)seed, yaml);
}

static void hash(const run_config *c, char out[65])
{
    hearth_err err = { { 0 } };
    assert_int_equal(run_config_hash(c, out, &err), 0);
}

/* ---- equal configs, different spellings ------------------------------------------ */

/* YAML text of a row's current value in *c (lists in flow style). */
static void value_text(const field_desc *f, const void *base, char *buf, size_t size)
{
    const char *p = (const char *)base + f->off;
    switch (f->type) {
    case FT_INT: snprintf(buf, size, "%d", *(const int *)p); break;
    case FT_I64: snprintf(buf, size, "%lld", (long long)*(const int64_t *)p); break;
    case FT_DOUBLE: snprintf(buf, size, "%.17g", *(const double *)p); break;
    case FT_FLOAT: snprintf(buf, size, "%.9g", (double)*(const float *)p); break;
    case FT_BOOL: snprintf(buf, size, "%s", *(const int *)p ? "true" : "false"); break;
    case FT_ENUM: snprintf(buf, size, "%s", f->names[*(const int *)p]); break;
    case FT_STR: snprintf(buf, size, "'%s'", p); break;
    case FT_INT3: {
        const int *v = (const int *)p;
        snprintf(buf, size, "[%d, %d, %d]", v[0], v[1], v[2]);
        break;
    }
    case FT_INTLIST: {
        int n = *(const int *)((const char *)base + f->count_off);
        size_t used = (size_t)snprintf(buf, size, "[");
        for (int i = 0; i < n; i++)
            used += (size_t)snprintf(buf + used, size - used, "%s%d", i ? ", " : "",
                                     ((const int *)p)[i]);
        snprintf(buf + used, size - used, "]");
        break;
    }
    case FT_BIAS_ALL: buf[0] = 0; break;
    }
}

static void shuffle(tu_rng *r, char **lines, int n)
{
    for (int i = n - 1; i > 0; i--) {
        int j = tu_randint(r, 0, i + 1);
        char *t = lines[i];
        lines[i] = lines[j];
        lines[j] = t;
    }
}

static void test_equal_spellings(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    const char *presets[] = { "tiny-vlm", "tiny-vlm-moe", "gpt2-124m" };
    for (int iter = 0; iter < 30; iter++) {
        const char *preset = presets[tu_randint(&r, 0, 3)];
        char base_yaml[128], h0[65], h[65];
        snprintf(base_yaml, sizeof base_yaml, "model: %s\n", preset);
        run_config ref;
        parse_ok(&ref, base_yaml, NULL, r.seed);
        hash(&ref, h0);

        /* A random subset of every key, written with the resolved value (or `auto`),
         * dotted or nested, in random order. */
        char *lines[200];
        int n = 0;
        lines[n] = malloc(128);
        snprintf(lines[n++], 128, tu_randint(&r, 0, 2) ? "model.preset: %s\n" : "model: %s\n", preset);
        int nc, nm, n_used = 0;
        char used[64][128];
        const field_desc *tc = config_fields(&nc), *tm = model_fields(&nm);
        for (int i = 0; i < nc; i++) {
            if (tu_randint(&r, 0, 2))
                continue;
            char v[256];
            if ((tc[i].flags & FIELD_AUTO) && tu_randint(&r, 0, 2))
                snprintf(v, sizeof v, "auto");
            else
                value_text(&tc[i], &ref, v, sizeof v);
            lines[n] = malloc(512);
            const char *dot = strrchr(tc[i].key, '.');
            char parent[128] = "";
            if (dot)
                snprintf(parent, sizeof parent, "%.*s", (int)(dot - tc[i].key), tc[i].key);
            int nest = dot && tu_randint(&r, 0, 2);
            for (int u = 0; nest && u < n_used; u++)   /* one `parent: {...}` line per parent */
                if (!strcmp(used[u], parent))
                    nest = 0;
            if (nest)
                snprintf(used[n_used++], sizeof used[0], "%s", parent);
            if (nest)   /* nested: parent: {leaf: v} */
                snprintf(lines[n++], 512, "%.*s: {%s: %s}\n", (int)(dot - tc[i].key), tc[i].key,
                         dot + 1, v);
            else
                snprintf(lines[n++], 512, "%s: %s\n", tc[i].key, v);
        }
        for (int i = 0; i < nm; i++) {
            if (tu_randint(&r, 0, 3) || tm[i].type == FT_BIAS_ALL ||
                (tm[i].comp == COMP_ENCODER && !ref.model.encoder.present) ||
                (tm[i].comp == COMP_PROJECTOR && !ref.model.projector.present))
                continue;
            char v[256];
            value_text(&tm[i], &ref.model, v, sizeof v);
            lines[n] = malloc(512);
            snprintf(lines[n++], 512, "model.%s: %s\n", tm[i].key, v);
        }
        shuffle(&r, lines, n);
        char *yaml = calloc(1, 65536);
        for (int i = 0; i < n; i++) {
            strcat(yaml, lines[i]);
            free(lines[i]);
        }
        /* `model: x` and `model.preset` together would be "set twice": keep the first. */
        run_config c;
        parse_ok(&c, yaml, NULL, r.seed);
        hash(&c, h);
        if (strcmp(h, h0) != 0) {
            hearth_err err;
            char *a = run_config_canonical_json(&ref, &err), *b = run_config_canonical_json(&c, &err);
            fail_msg("hash differs for an equivalent spelling (seed %llu)\n%s\n%s\n%s",
                     (unsigned long long)r.seed, yaml, a, b);
        }
        free(yaml);
    }
    /* A few fixed spellings of the same config. */
    const char *same[] = {
        "model: tiny-vlm\n",
        "model: {preset: tiny-vlm}\n",
        "model:\n  preset: tiny-vlm\ntrain:\n  lr: 3e-4\n  min_lr: 3e-5\n",
        "train.min_lr: auto\nparallel: {dp: 1, encoder: {tp: auto}}\ncomm: local\nmodel: tiny-vlm\n",
        "model: {preset: tiny-vlm, decoder: {bias: {qkv: true, proj: false}, moe: {experts: 0}}}\n",
    };
    char h0[65], h[65];
    run_config c;
    parse_ok(&c, same[0], NULL, 0);
    hash(&c, h0);
    for (size_t i = 1; i < sizeof same / sizeof *same; i++) {
        parse_ok(&c, same[i], NULL, 0);
        hash(&c, h);
        if (strcmp(h, h0))
            fail_msg("hash differs for\n%s", same[i]);
    }
}

/* ---- any change of a value changes the hash ------------------------------------- */

static int mutate(tu_rng *r, const field_desc *f, void *base)
{
    char *p = (char *)base + f->off;
    switch (f->type) {
    case FT_INT: *(int *)p += tu_randint(r, 0, 2) ? tu_randint(r, 1, 100) : -tu_randint(r, 1, 100); break;
    case FT_I64: *(int64_t *)p += tu_randint(r, 1, 1000); break;
    case FT_DOUBLE: {
        double *d = (double *)p, dir = tu_randint(r, 0, 2) ? INFINITY : -INFINITY;
        for (int i = tu_randint(r, 1, 4); i > 0; i--)
            *d = nextafter(*d, dir);
        break;
    }
    case FT_FLOAT: *(float *)p = nextafterf(*(float *)p, tu_randint(r, 0, 2) ? INFINITY : -INFINITY); break;
    case FT_BOOL: *(int *)p = !*(int *)p; break;
    case FT_ENUM: {
        int n = 0;
        while (f->names[n])
            n++;
        *(int *)p = (*(int *)p + tu_randint(r, 1, n)) % n;
        break;
    }
    case FT_STR: {
        size_t len = strlen(p);
        if (len + 1 < f->size) {
            p[len] = (char)('a' + tu_randint(r, 0, 26));
            p[len + 1] = 0;
        } else {
            p[0] = p[0] == 'x' ? 'y' : 'x';
        }
        break;
    }
    case FT_INT3: ((int *)p)[tu_randint(r, 0, 3)] += tu_randint(r, 1, 9); break;
    case FT_INTLIST: {
        int *count = (int *)((char *)base + f->count_off);
        if (*count < (int)f->size && (tu_randint(r, 0, 2) || *count == 0))
            ((int *)p)[(*count)++] = tu_randint(r, 0, 100);
        else
            ((int *)p)[tu_randint(r, 0, *count)] += tu_randint(r, 1, 9);
        break;
    }
    case FT_BIAS_ALL: return 0;
    }
    return 1;
}

static void test_any_change(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    const char *presets[] = { "tiny-vlm-moe", "gpt2-124m" };
    for (int p = 0; p < 2; p++) {
        char yaml[64];
        snprintf(yaml, sizeof yaml, "model: %s\n", presets[p]);
        run_config ref;
        parse_ok(&ref, yaml, NULL, r.seed);
        char h0[65];
        hash(&ref, h0);
        int nc, nm;
        const field_desc *tc = config_fields(&nc), *tm = model_fields(&nm);
        /* every key once, then random picks */
        for (int k = 0; k < 3 * (nc + nm); k++) {
            int pick = k < nc + nm ? k : tu_randint(&r, 0, nc + nm);
            int is_model = pick >= nc;
            const field_desc *f = is_model ? &tm[pick - nc] : &tc[pick];
            if (is_model && ((f->comp == COMP_ENCODER && !ref.model.encoder.present) ||
                             (f->comp == COMP_PROJECTOR && !ref.model.projector.present)))
                continue;
            run_config c = ref;
            if (!mutate(&r, f, is_model ? (void *)&c.model : (void *)&c))
                continue;
            char h[65];
            hash(&c, h);
            if (strcmp(h, h0) == 0)
                fail_msg("changing %s%s left the hash unchanged (seed %llu)",
                         is_model ? "model." : "", f->key, (unsigned long long)r.seed);
        }
        run_config c = ref;
        snprintf(c.model_preset, sizeof c.model_preset, "%s.yaml", presets[p]);
        char h[65];
        hash(&c, h);
        assert_string_not_equal(h, h0);
    }
    /* Through the parser too: a random safe key gets another value. */
    const char *keys[] = { "train.steps", "train.seed", "train.lr", "train.warmup",
                           "train.weight_decay", "train.grad_clip", "train.checkpoint_every",
                           "train.measure_from", "data.images_max", "data.image_px_max",
                           "model.decoder.rope_theta", "model.decoder.layers",
                           "model.encoder.norm_eps", "model.decoder.moe.aux_coef" };
    run_config ref;
    parse_ok(&ref, "model: tiny-vlm\n", NULL, r.seed);
    char h0[65];
    hash(&ref, h0);
    for (int iter = 0; iter < 30; iter++) {
        const char *k = keys[tu_randint(&r, 0, sizeof keys / sizeof *keys)];
        char set[128];
        int v = tu_randint(&r, 1, 50);
        if (!strcmp(k, "model.decoder.layers"))
            v = 2 * tu_randint(&r, 3, 10);   /* not 4 */
        if (!strcmp(k, "train.seed") || !strcmp(k, "train.steps"))
            v += 20;
        if (!strcmp(k, "data.images_max") || !strcmp(k, "data.image_px_max"))
            v += 64;
        if (!strcmp(k, "train.measure_from"))
            v += 2;
        if (!strcmp(k, "model.encoder.norm_eps"))
            snprintf(set, sizeof set, "%s=%de-9", k, v);
        else if (strstr(k, "lr") || strstr(k, "coef") || strstr(k, "decay") || strstr(k, "clip"))
            snprintf(set, sizeof set, "%s=%de-7", k, v);
        else
            snprintf(set, sizeof set, "%s=%d", k, v);
        const char *sets[] = { set, NULL };
        run_config c;
        parse_ok(&c, "model: tiny-vlm\n", sets, r.seed);
        char h[65];
        hash(&c, h);
        if (!strcmp(h, h0))
            fail_msg("%s left the hash unchanged (seed %llu)", set, (unsigned long long)r.seed);
    }
}

/* ---- the JSON text itself ---------------------------------------------------------- */

static void check_sorted(const json_t *v)
{
    if (json_is_object(v)) {
        const char *key, *prev = NULL;
        json_t *val;
        json_object_foreach((json_t *)v, key, val) {
            if (prev && strcmp(prev, key) >= 0)
                fail_msg("keys out of order: %s before %s", prev, key);
            prev = key;
            check_sorted(val);
        }
    } else if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            check_sorted(json_array_get(v, i));
    }
}

static const json_t *at_path(const json_t *root, const char *key)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", key);
    const json_t *o = root;
    for (char *save = NULL, *part = strtok_r(buf, ".", &save); part && o;
         part = strtok_r(NULL, ".", &save))
        o = json_object_get(o, part);
    return o;
}

static void test_json_text(void **state)
{
    (void)state;
    const char *presets[] = { "tiny-vlm", "tiny-vlm-moe", "qwen2.5-vl-3b", "gpt2-124m" };
    for (int p = 0; p < 4; p++) {
        char yaml[64];
        snprintf(yaml, sizeof yaml, "model: %s\n", presets[p]);
        run_config c;
        parse_ok(&c, yaml, NULL, 0);
        hearth_err err = { { 0 } };
        char *s = run_config_canonical_json(&c, &err);
        assert_non_null(s);
        for (const char *q = s; *q; q++)
            if (isspace((unsigned char)*q))
                fail_msg("whitespace in the canonical JSON: %s", s);
        json_error_t je;
        json_t *j = json_loads(s, 0, &je);
        if (!j)
            fail_msg("not JSON: %s: %s", je.text, s);
        check_sorted(j);
        /* Dumping what was read gives the same text: numbers survive the round trip. */
        char *again = canon_json_dump(j);
        assert_string_equal(again, s);
        free(again);
        int nc, nm;
        const field_desc *tc = config_fields(&nc), *tm = model_fields(&nm);
        for (int i = 0; i < nc; i++)
            if (!at_path(j, tc[i].key))
                fail_msg("%s missing from the JSON", tc[i].key);
        const json_t *model = json_object_get(j, "model");
        for (int i = 0; i < nm; i++) {
            if (tm[i].type == FT_BIAS_ALL)
                continue;
            int absent = (tm[i].comp == COMP_ENCODER && !c.model.encoder.present) ||
                         (tm[i].comp == COMP_PROJECTOR && !c.model.projector.present);
            if (!absent && !at_path(model, tm[i].key))
                fail_msg("model.%s missing from the JSON", tm[i].key);
        }
        assert_string_equal(json_string_value(json_object_get(model, "preset")), presets[p]);
        if (!c.model.encoder.present) {
            assert_true(json_is_null(json_object_get(model, "encoder")));
            assert_true(json_is_null(json_object_get(model, "projector")));
        }
        /* The hash is the sha256 of exactly this text. */
        unsigned char md[32];
        unsigned int len = 0;
        assert_int_equal(EVP_Digest(s, strlen(s), md, &len, EVP_sha256(), NULL), 1);
        char want[65], got[65];
        for (int i = 0; i < 32; i++)
            snprintf(want + 2 * i, 3, "%02x", md[i]);
        hash(&c, got);
        assert_string_equal(got, want);
        json_decref(j);
        free(s);
    }
}

/* Significant digits of a %g-style text (a ".0" added to integral values not counted). */
static int digits(const char *s)
{
    size_t len = strlen(s);
    int n = 0, lead = 1;
    if (len > 2 && !strcmp(s + len - 2, ".0") && !strpbrk(s, "eE"))
        n = -1;
    for (; *s && *s != 'e' && *s != 'E'; s++) {
        if (*s < '0' || *s > '9')
            continue;
        if (lead && *s == '0')
            continue;
        lead = 0;
        n++;
    }
    return n;
}

static void test_shortest_numbers(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    char buf[64], shorter[400];
    for (int i = 0; i < 20000; i++) {
        double d;
        if (i % 2) {
            uint64_t bits = tu_next(&r);
            memcpy(&d, &bits, sizeof d);
            if (!isfinite(d))
                continue;
        } else {
            d = (tu_uniform(&r) - 0.5) * pow(10, tu_randint(&r, -12, 12));
            if (i % 4 == 0)   /* short decimals like 3e-4 */
                d = tu_randint(&r, 1, 1000) * pow(10, tu_randint(&r, -10, 10));
        }
        shape_format_double(d, buf, sizeof buf);
        if (strtod(buf, NULL) != d)
            fail_msg("%s does not read back as %.17g (seed %llu)", buf, d, (unsigned long long)r.seed);
        if (!strchr(buf, '.') && !strchr(buf, 'e'))
            fail_msg("%s would read back as an integer", buf);
        int n = digits(buf);
        if (n > 1 && !(d == floor(d) && fabs(d) < 1e15)) {
            snprintf(shorter, sizeof shorter, "%.*g", n - 1, d);
            if (strtod(shorter, NULL) == d)
                fail_msg("%s is not the shortest: %s reads back too (seed %llu)", buf, shorter,
                         (unsigned long long)r.seed);
        }
        float f = (float)d;
        if (!isfinite(f))
            continue;
        shape_format_float(f, buf, sizeof buf);
        if (strtof(buf, NULL) != f)
            fail_msg("%s does not read back as float %.9g", buf, (double)f);
        n = digits(buf);
        if (n > 1) {
            snprintf(shorter, sizeof shorter, "%.*g", n - 1, (double)f);
            if (strtof(shorter, NULL) == f)
                fail_msg("%s is not the shortest float text: %s", buf, shorter);
        }
    }
    shape_format_double(1e4, buf, sizeof buf);
    assert_string_equal(buf, "10000.0");
    shape_format_double(3e-4, buf, sizeof buf);
    assert_string_equal(buf, "0.0003");
    shape_format_float(1e-6f, buf, sizeof buf);
    assert_string_equal(buf, "1e-06");
}

/* ---- the fast writers against the plain ways --------------------------------------
 * The canonical text is written directly (run_json.c, canon_json.c) for speed; these
 * compare it, on fresh random inputs, with the plain definitions: printf loops for the
 * numbers, a jansson tree dumped with sorted keys for the whole config. */

/* The number texts as defined: the smallest "%.*g" precision that reads back. */
static void ref_double(double v, char *buf, size_t size)
{
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, size, "%.1f", v);
        return;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, size, "%.*g", p, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    if (!strpbrk(buf, ".eEni"))
        strcat(buf, ".0");
}

static void ref_float(float v, char *buf, size_t size)
{
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, size, "%.*g", p, (double)v);
        if (strtof(buf, NULL) == v)
            break;
    }
    if (!strpbrk(buf, ".eEni"))
        strcat(buf, ".0");
}

/* Doubles of the kinds that are hard to print: any bit pattern, short decimals, exact
 * decimal ties (x.5, dyadic fractions), neighbours of powers of ten, integers near 1e15,
 * subnormals. */
static double random_double(tu_rng *r)
{
    switch (tu_randint(r, 0, 9)) {
    case 0: {
        uint64_t bits = tu_next(r);
        double d;
        memcpy(&d, &bits, sizeof d);
        return d;
    }
    case 1: return tu_randint(r, 1, 100000) * pow(10, tu_randint(r, -25, 25));
    case 2: return tu_randint(r, -100000, 100000) + 0.5;
    case 3: return ldexp((double)(tu_next(r) >> tu_randint(r, 11, 60)) + 0.5, tu_randint(r, -60, 10));
    case 4: return ldexp(1.0, tu_randint(r, -1074, 1024));
    case 5: return nextafter(pow(10, tu_randint(r, -30, 30)),
                             tu_randint(r, 0, 2) ? INFINITY : -INFINITY);
    case 6: return 1e15 + tu_randint(r, -20, 20) + 0.25 * tu_randint(r, 0, 4);
    case 7: return (double)tu_randint(r, 1, 1000) / tu_randint(r, 1, 1000) *
                   pow(10, tu_randint(r, -20, 20));
    default: return (tu_randint(r, 0, 2) ? 1 : -1) * tu_randint(r, 0, 1000) *
                    pow(10, tu_randint(r, -8, 4));
    }
}

static float random_float(tu_rng *r)
{
    switch (tu_randint(r, 0, 4)) {
    case 0: {
        uint32_t bits = (uint32_t)tu_next(r);
        float f;
        memcpy(&f, &bits, sizeof f);
        return f;
    }
    case 1: return ldexpf(1.0f, tu_randint(r, -149, 128));
    case 2: return (float)(tu_randint(r, 1, 100000) * pow(10, tu_randint(r, -45, 38)));
    default: return (float)random_double(r);
    }
}

static void test_numbers_match_printf(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    char got[64], want[64], buf[64];
    for (int i = 0; i < 20000; i++) {
        double d = random_double(&r);
        if (i % 1000 == 0)
            d = i % 2000 ? NAN : -INFINITY;
        ref_double(d, want, sizeof want);
        size_t n = canon_format_double(d, got);
        if (strcmp(got, want) || n != strlen(want))
            fail_msg("double %a: %s, printf gives %s (seed %llu)", d, got, want,
                     (unsigned long long)r.seed);
        float f = random_float(&r);
        ref_float(f, want, sizeof want);
        n = canon_format_float(f, got);
        if (strcmp(got, want) || n != strlen(want))
            fail_msg("float %a: %s, printf gives %s (seed %llu)", (double)f, got, want,
                     (unsigned long long)r.seed);
        shape_format_float(f, buf, sizeof buf);
        assert_string_equal(buf, want);
        /* strtod(printf("%.*g")) without the text (run_config_derive's min_lr) */
        int digits = tu_randint(&r, 1, 18);
        snprintf(buf, sizeof buf, "%.*g", digits, d);
        double a = strtod(buf, NULL), b = canon_round_digits(d, digits);
        if (memcmp(&a, &b, sizeof a) && !(isnan(a) && isnan(b)))
            fail_msg("%a to %d digits: %a, printf and strtod give %a (seed %llu)", d, digits, b,
                     a, (unsigned long long)r.seed);
    }
}

/* The old way to the same text: a jansson tree from the key tables, dumped sorted. */
static json_t *ref_parent(json_t *root, const char *key, char *leaf, size_t size)
{
    json_t *o = root;
    const char *p = key;
    for (const char *dot; (dot = strchr(p, '.')); p = dot + 1) {
        char part[64];
        snprintf(part, sizeof part, "%.*s", (int)(dot - p), p);
        json_t *next = json_object_get(o, part);
        if (!next) {
            next = json_object();
            json_object_set_new(o, part, next);
        }
        if (!json_is_object(next))
            return NULL;
        o = next;
    }
    snprintf(leaf, size, "%s", p);
    return o;
}

static json_t *ref_ints(const int *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_integer(v[i]));
    return a;
}

static json_t *ref_field(const field_desc *f, const void *base)
{
    const char *p = (const char *)base + f->off;
    char buf[64];
    switch (f->type) {
    case FT_INT: return json_integer(*(const int *)p);
    case FT_I64: return json_integer((json_int_t) * (const int64_t *)p);
    case FT_DOUBLE: return json_real(*(const double *)p);
    case FT_FLOAT:
        ref_float(*(const float *)p, buf, sizeof buf);
        return json_real(strtod(buf, NULL));
    case FT_BOOL: return json_boolean(*(const int *)p);
    case FT_ENUM: {
        int v = *(const int *)p, n = 0;
        while (f->names[n])
            n++;
        return json_string(v >= 0 && v < n ? f->names[v] : "?");
    }
    case FT_STR: return json_stringn_nocheck(p, strlen(p));
    case FT_INT3: return ref_ints((const int *)p, 3);
    case FT_INTLIST: {
        int n = *(const int *)((const char *)base + f->count_off);
        n = n < 0 ? 0 : (size_t)n > f->size ? (int)f->size : n;
        return ref_ints((const int *)p, n);
    }
    case FT_BIAS_ALL: break;
    }
    return NULL;
}

static int ref_rows(json_t *root, const field_desc *t, int n, const void *base, unsigned skip)
{
    for (int i = 0; i < n; i++) {
        if ((t[i].flags & FIELD_NO_JSON) || (skip & (1u << t[i].comp)))
            continue;
        char leaf[64];
        json_t *parent = ref_parent(root, t[i].key, leaf, sizeof leaf), *v = ref_field(&t[i], base);
        if (!parent || !v) {
            json_decref(v);
            return -1;
        }
        json_object_set_new(parent, leaf, v);
    }
    return 0;
}

/* NULL where the config holds a nan or inf (JSON has no such numbers). */
static char *ref_json(const run_config *c)
{
    json_t *root = json_object(), *model = json_object();
    json_object_set_new(root, "model", model);
    int nc, nm;
    const field_desc *tc = config_fields(&nc), *tm = model_fields(&nm);
    unsigned skip = 0;
    if (!c->model.encoder.present) {
        skip |= 1u << COMP_ENCODER;
        json_object_set_new(model, "encoder", json_null());
    }
    if (!c->model.projector.present) {
        skip |= 1u << COMP_PROJECTOR;
        json_object_set_new(model, "projector", json_null());
    }
    char *s = NULL;
    if (!ref_rows(root, tc, nc, c, 0) && !ref_rows(model, tm, nm, &c->model, skip)) {
        json_object_set_new(model, "preset",
                            json_stringn_nocheck(c->model_preset, strlen(c->model_preset)));
        s = canon_json_dump(root);
    }
    json_decref(root);
    return s;
}

static void random_text(tu_rng *r, char *p, size_t size)
{
    size_t n = (size_t)tu_randint(r, 0, tu_randint(r, 0, 4) ? 24 : (int)size);
    for (size_t i = 0; i < n; i++) {
        int k = tu_randint(r, 0, 8);
        p[i] = (char)(k == 0 ? tu_randint(r, 1, 32) : k == 1 ? '"' : k == 2 ? '\\'
                      : k == 3 ? tu_randint(r, 128, 256) : tu_randint(r, 32, 127));
    }
    p[n] = '\0';
}

/* Any value a row can hold, in range or not (the writer must not care). */
static void randomize(tu_rng *r, const field_desc *f, void *base)
{
    char *p = (char *)base + f->off;
    switch (f->type) {
    case FT_INT: *(int *)p = tu_randint(r, 0, 4) ? tu_randint(r, -1000, 100000) : (int)tu_next(r); break;
    case FT_I64: *(int64_t *)p = (int64_t)tu_next(r); break;
    case FT_DOUBLE: *(double *)p = tu_randint(r, 0, 50) ? random_double(r) : NAN; break;
    case FT_FLOAT: *(float *)p = random_float(r); break;
    case FT_BOOL: *(int *)p = tu_randint(r, -2, 3); break;
    case FT_ENUM: {
        int n = 0;
        while (f->names[n])
            n++;
        *(int *)p = tu_randint(r, -2, n + 2);
        break;
    }
    case FT_STR: random_text(r, p, f->size); break;
    case FT_INT3: for (int i = 0; i < 3; i++) ((int *)p)[i] = tu_randint(r, -50, 5000); break;
    case FT_INTLIST:
        *(int *)((char *)base + f->count_off) = tu_randint(r, -3, (int)f->size + 4);
        for (size_t i = 0; i < f->size; i++)
            ((int *)p)[i] = tu_randint(r, -100, 100000);
        break;
    case FT_BIAS_ALL: break;
    }
}

static void test_json_matches_jansson(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    const char *presets[] = { "tiny-vlm", "tiny-vlm-moe", "gpt2-124m" };
    run_config base[3];
    for (int p = 0; p < 3; p++) {
        char yaml[64];
        snprintf(yaml, sizeof yaml, "model: %s\n", presets[p]);
        parse_ok(&base[p], yaml, NULL, r.seed);
    }
    int nc, nm;
    const field_desc *tc = config_fields(&nc), *tm = model_fields(&nm);
    for (int iter = 0; iter < 400; iter++) {
        run_config c = base[tu_randint(&r, 0, 3)];
        int rate = tu_randint(&r, 0, 5);   /* none, all, or about 1 row in 2^(rate-1) */
        for (int k = 0; rate && k < nc + nm; k++)
            if (tu_randint(&r, 0, 1 << (rate - 1)) == 0)
                randomize(&r, k < nc ? &tc[k] : &tm[k - nc], k < nc ? (void *)&c : (void *)&c.model);
        if (tu_randint(&r, 0, 4) == 0)
            c.model.encoder.present = !c.model.encoder.present;
        if (tu_randint(&r, 0, 4) == 0)
            c.model.projector.present = !c.model.projector.present;
        if (tu_randint(&r, 0, 8) == 0)
            random_text(&r, c.model_preset, sizeof c.model_preset);
        char *want = ref_json(&c);
        hearth_err err = { { 0 } };
        char *got = run_config_canonical_json(&c, &err);
        if (!want != !got || (want && strcmp(want, got)))
            fail_msg("canonical JSON differs from the jansson dump (seed %llu)\n%s\n%s",
                     (unsigned long long)r.seed, got ? got : err.msg, want ? want : "(fails)");
        char h[65];
        int rc = run_config_hash(&c, h, &err);
        if (!want) {
            assert_int_not_equal(rc, 0);
        } else {
            unsigned char md[32];
            unsigned int len = 0;
            char hex[65];
            assert_int_equal(rc, 0);
            assert_int_equal(EVP_Digest(want, strlen(want), md, &len, EVP_sha256(), NULL), 1);
            for (int i = 0; i < 32; i++)
                snprintf(hex + 2 * i, 3, "%02x", md[i]);
            assert_string_equal(h, hex);
        }
        free(want);
        free(got);
    }
}

/* run_json.c's precomputed key order is the sorted order of today's key tables. */
static void test_key_order_current(void **state)
{
    (void)state;
    char *fix = NULL;
    if (run_json_order_check(&fix)) {
        /* not an error in the product (it sorts per call then), but slow: regenerate */
        fprintf(stderr, "key_order in trainer/shape/run_json.c is out of date; replace it "
                "with:\n%s", fix ? fix : "(out of memory)\n");
        free(fix);
        fail_msg("key_order in trainer/shape/run_json.c does not fit the key tables");
    }
    assert_null(fix);
}

/* canon_tree: members in canonical order nest into the same text canon_json_dump gives;
 * any other order, a repeated key or a name that is both a value and an object is
 * refused before it is written. */
static int dotted_before(const void *pa, const void *pb)
{
    const char *a = *(const char *const *)pa, *b = *(const char *const *)pb;
    for (;; a++, b++) {
        /* the end of a name, then '.', then every other byte */
        unsigned ca = *a == '.' ? 1u : *a ? (unsigned char)*a + 1u : 0u;
        unsigned cb = *b == '.' ? 1u : *b ? (unsigned char)*b + 1u : 0u;
        if (ca != cb || !ca)
            return (int)ca - (int)cb;
    }
}

static void test_tree_order(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    const char *alphabet[] = { "a", "b", "ab", "a-b", "a_b", "B", "z", "\"q\"", "a\\b", "x\x01" };
    for (int iter = 0; iter < 300; iter++) {
        /* random dotted keys without a key that is also a section of another */
        char pool[40][64];
        const char *keys[40];
        int n = 0;
        for (int tries = 0; tries < 80 && n < 40; tries++) {
            char k[64] = "";
            int depth = tu_randint(&r, 1, 4);
            for (int d = 0; d < depth; d++) {
                if (d)
                    strcat(k, ".");
                strcat(k, alphabet[tu_randint(&r, 0, 10)]);
            }
            int clash = 0;
            for (int i = 0; i < n && !clash; i++) {
                size_t a = strlen(k), b = strlen(keys[i]);
                clash = !strcmp(k, keys[i]) || (a < b && !strncmp(k, keys[i], a) && keys[i][a] == '.') ||
                        (b < a && !strncmp(k, keys[i], b) && k[b] == '.');
            }
            if (!clash) {
                snprintf(pool[n], sizeof pool[n], "%s", k);
                keys[n] = pool[n];
                n++;
            }
        }
        qsort(keys, (size_t)n, sizeof *keys, dotted_before);
        canon_buf b = { 0 };
        canon_tree t;
        canon_tree_begin(&t, &b);
        json_t *root = json_object();
        char pre[40][64];   /* the tree keeps pointers to the names until the end */
        for (int i = 0; i < n; i++) {
            const char *prefix = "";
            const char *key = keys[i];
            const char *dot = strchr(key, '.');
            if (dot && tu_randint(&r, 0, 2)) {   /* also through a prefix */
                snprintf(pre[i], sizeof pre[i], "%.*s", (int)(dot - key + 1), key);
                prefix = pre[i];
                key = dot + 1;
            }
            if (canon_tree_key(&t, prefix, key))
fail_msg("sorted key %s refused (seed %llu)", keys[i], (unsigned long long)r.seed);
            canon_put_int(&b, i);
            char leaf[64];
            json_object_set_new(ref_parent(root, keys[i], leaf, sizeof leaf), leaf, json_integer(i));
        }
        canon_tree_end(&t);
        char *got = canon_buf_finish(&b), *want = canon_json_dump(root);
        if (strcmp(got, want))
            fail_msg("tree text differs (seed %llu)\n%s\n%s", (unsigned long long)r.seed, got, want);
        free(got);
        free(want);
        json_decref(root);

        /* swap two keys, repeat one, or write a value where a section is open */
        if (n < 2)
            continue;
        int i = tu_randint(&r, 0, n - 1), kind = tu_randint(&r, 0, 3);
        canon_buf b2 = { 0 };
        canon_tree_begin(&t, &b2);
        int refused = 0;
        for (int k = 0; k <= i && !refused; k++)
            refused = canon_tree_key(&t, "", keys[k]) != 0;
        assert_false(refused);
        char bad[64];
        if (kind == 0) {
            snprintf(bad, sizeof bad, "%s", keys[i]);   /* the same again */
        } else if (kind == 1 && dotted_before(&keys[i + 1], &keys[i]) > 0) {
            snprintf(bad, sizeof bad, "%s", keys[i]);
            canon_tree_key(&t, "", keys[i + 1]);      /* then one before it */
        } else {
            snprintf(bad, sizeof bad, "%s", keys[i]);
            char *dot = strrchr(bad, '.');
            if (!dot)
                snprintf(bad, sizeof bad, "%s", keys[i]);   /* no section: repeat */
            else
                *dot = '\0';                                /* its open section as a value */
        }
        size_t len = b2.len;
        if (!canon_tree_key(&t, "", bad))
            fail_msg("%s accepted after %s (seed %llu)", bad, keys[i], (unsigned long long)r.seed);
        assert_int_equal(b2.len, len);
        canon_buf_free(&b2);
    }
}

/* run_config_derive by table row against the rules written with key names. */
static int ref_auto(const unsigned char *is_auto, const char *key)
{
    int n;
    const field_desc *t = config_fields(&n);
    int i = field_find(t, n, key);
    return i >= 0 && is_auto[i];
}

static void test_derive_rules(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    for (int iter = 0; iter < 20000; iter++) {
        run_config c;
        memset(&c, 0, sizeof c);
        unsigned char is_auto[FIELDS_MAX];
        for (int k = 0; k < FIELDS_MAX; k++)
            is_auto[k] = tu_randint(&r, 0, 3) == 0;
        c.device = tu_randint(&r, 0, 2);
        c.comm = tu_randint(&r, 0, 2);
        c.ranks = tu_randint(&r, 1, 300);
        c.parallel.tp = tu_randint(&r, 1, 40);
        c.parallel.cp = tu_randint(&r, 1, 4);
        c.parallel.pp = tu_randint(&r, 1, 8);
        c.parallel.dp = tu_randint(&r, 1, 9);
        c.parallel.encoder.strategy = tu_randint(&r, 0, 4);
        c.parallel.encoder.tp = tu_randint(&r, 1, 9);
        c.train.micro_batch = tu_randint(&r, 1, 1 << 20);
        c.train.global_batch = tu_randint(&r, 1, 9);
        c.train.lr = tu_randint(&r, 0, 2) ? tu_randint(&r, 0, 1000) * pow(10, -tu_randint(&r, 0, 12))
                                           : fabs(random_double(&r));
        c.train.min_lr = 0.5;
        run_config want = c;
        if (ref_auto(is_auto, "comm"))
            want.comm = want.device == DEVICE_CUDA ? COMM_NCCL : COMM_LOCAL;
        if (ref_auto(is_auto, "parallel.dp")) {
            long mp = (long)want.parallel.tp * want.parallel.cp * want.parallel.pp;
            want.parallel.dp = want.ranks % mp == 0 ? (int)(want.ranks / mp) : 0;
        }
        if (ref_auto(is_auto, "parallel.encoder.tp")) {
            int tp = want.parallel.tp, etp = 1;
            if (want.parallel.encoder.strategy == ENC_UNIFORM)
                etp = tp;
            else if (want.parallel.encoder.strategy == ENC_HETERO_TP)
                for (int d = tp - 1; d >= 1 && etp == 1; d--)
                    if (tp % d == 0)
                        etp = d;
            want.parallel.encoder.tp = etp;
        }
        if (ref_auto(is_auto, "train.global_batch")) {
            long long gb = (long long)want.train.micro_batch * want.parallel.dp;
            want.train.global_batch = gb > INT_MAX ? INT_MAX : (int)gb;
        }
        if (ref_auto(is_auto, "train.min_lr")) {
            char buf[40];
            snprintf(buf, sizeof buf, "%.15g", want.train.lr / 10);
            want.train.min_lr = strtod(buf, NULL);
        }
        run_config_derive(&c, is_auto);
        if (c.comm != want.comm || c.parallel.dp != want.parallel.dp ||
            c.parallel.encoder.tp != want.parallel.encoder.tp ||
            c.train.global_batch != want.train.global_batch ||
            memcmp(&c.train.min_lr, &want.train.min_lr, sizeof(double)))
            fail_msg("derive differs (seed %llu): comm %d/%d dp %d/%d etp %d/%d gb %d/%d "
                     "min_lr %a/%a (lr %a)", (unsigned long long)r.seed, c.comm, want.comm,
                     c.parallel.dp, want.parallel.dp, c.parallel.encoder.tp,
                     want.parallel.encoder.tp, c.train.global_batch, want.train.global_batch,
                     c.train.min_lr, want.train.min_lr, c.train.lr);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equal_spellings),
        cmocka_unit_test(test_any_change),
        cmocka_unit_test(test_json_text),
        cmocka_unit_test(test_shortest_numbers),
        cmocka_unit_test(test_numbers_match_printf),
        cmocka_unit_test(test_json_matches_jansson),
        cmocka_unit_test(test_key_order_current),
        cmocka_unit_test(test_tree_order),
        cmocka_unit_test(test_derive_rules),
    };
    return cmocka_run_group_tests_name("config_hash", tests, NULL, NULL);
}
