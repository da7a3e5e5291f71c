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
        assert_string_equal(json_string_value(json_object_get(j, "model_preset")), presets[p]);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equal_spellings),
        cmocka_unit_test(test_any_change),
        cmocka_unit_test(test_json_text),
        cmocka_unit_test(test_shortest_numbers),
    };
    return cmocka_run_group_tests_name("config_hash", tests, NULL, NULL);
}
