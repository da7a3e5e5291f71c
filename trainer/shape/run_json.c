/* run_json.c - the resolved run config as JSON, its canonical text and the config hash.
 *
 * The JSON is produced from the key tables (fields.h), so every key a user can set is
 * in it: the run-config keys nested by their dotted names, `model` with every field of
 * the resolved shape ("encoder"/"projector" null for a text-only model) and
 * `model_preset`.  Float fields (norm_eps, moe.aux_coef) are written with the shortest
 * text that reads back as the same float, so 1e-6 stays 1e-06, not 9.99999997e-07. */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shape/canon_json.h"
#include "shape/fields.h"
#include "shape/run_config.h"
#include "shape/shape_internal.h"

/* The object at the dotted path's parent, created as needed; *leaf gets the last part. */
static json_t *parent_of(json_t *root, const char *key, char *leaf, size_t size)
{
    json_t *o = root;
    const char *p = key;
    for (const char *dot; (dot = strchr(p, '.')); p = dot + 1) {
        char part[64];
        size_t len = (size_t)(dot - p);
        if (len >= sizeof part)
            return NULL;
        memcpy(part, p, len);
        part[len] = 0;
        json_t *next = json_object_get(o, part);
        if (!next) {
            next = json_object();
            if (!next || json_object_set_new(o, part, next))
                return NULL;
        }
        if (!json_is_object(next))
            return NULL;
        o = next;
    }
    snprintf(leaf, size, "%s", p);
    return o;
}

static json_t *int_array(const int *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer(v[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static json_t *text(const char *s)
{
    json_t *j = json_string(s);
    return j ? j : json_stringn_nocheck(s, strlen(s));
}

static json_t *field_json(const field_desc *f, const void *base)
{
    const char *p = (const char *)base + f->off;
    char buf[64];
    switch (f->type) {
    case FT_INT:
        return json_integer(*(const int *)p);
    case FT_I64:
        return json_integer((json_int_t) * (const int64_t *)p);
    case FT_DOUBLE:
        return json_real(*(const double *)p);
    case FT_FLOAT:
        shape_format_float(*(const float *)p, buf, sizeof buf);
        return json_real(strtod(buf, NULL));
    case FT_BOOL:
        return json_boolean(*(const int *)p);
    case FT_ENUM: {
        int v = *(const int *)p, n = 0;
        while (f->names[n])
            n++;
        return text(v >= 0 && v < n ? f->names[v] : "?");
    }
    case FT_STR:
        return text(p);
    case FT_INT3:
        return int_array((const int *)p, 3);
    case FT_INTLIST: {
        int n = *(const int *)((const char *)base + f->count_off);
        if (n < 0)
            n = 0;
        if ((size_t)n > f->size)
            n = (int)f->size;
        return int_array((const int *)p, n);
    }
    case FT_BIAS_ALL:
        break;
    }
    return NULL;
}

static int add_rows(json_t *root, const field_desc *t, int n, const void *base,
                    unsigned skip_comp_mask)
{
    for (int i = 0; i < n; i++) {
        if ((t[i].flags & FIELD_NO_JSON) || (skip_comp_mask & (1u << t[i].comp)))
            continue;
        char leaf[64];
        json_t *parent = parent_of(root, t[i].key, leaf, sizeof leaf);
        json_t *v = field_json(&t[i], base);
        if (!parent || !v) {
            json_decref(v);
            return -1;
        }
        if (json_object_set_new(parent, leaf, v))
            return -1;
    }
    return 0;
}

/* The resolved config as a jansson object (caller decrefs), or NULL when out of memory. */
static json_t *run_config_json(const run_config *c)
{
    json_t *root = json_object(), *model = json_object();
    if (!root || !model || json_object_set_new(root, "model", model)) {
        json_decref(root);
        return NULL;
    }
    int nc, nm;
    const field_desc *tc = config_fields(&nc), *tm = model_fields(&nm);
    unsigned skip = 0;
    if (!c->model.encoder.present) {
        skip |= 1u << COMP_ENCODER;
        if (json_object_set_new(model, "encoder", json_null()))
            goto fail;
    }
    if (!c->model.projector.present) {
        skip |= 1u << COMP_PROJECTOR;
        if (json_object_set_new(model, "projector", json_null()))
            goto fail;
    }
    if (add_rows(root, tc, nc, c, 0) || add_rows(model, tm, nm, &c->model, skip) ||
        json_object_set_new(root, "model_preset", text(c->model_preset)))
        goto fail;
    return root;
fail:
    json_decref(root);
    return NULL;
}

char *run_config_canonical_json(const run_config *c, hearth_err *err)
{
    json_t *j = run_config_json(c);
    char *s = j ? canon_json_dump(j) : NULL;
    json_decref(j);
    if (!s)
        herr_set(err, HERR_NOMEM, "out of memory while writing the config as JSON");
    return s;
}

int run_config_hash(const run_config *c, char out_hex[65], hearth_err *err)
{
    char *s = run_config_canonical_json(c, err);
    if (!s)
        return HERR_NOMEM;
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    int ok = EVP_Digest(s, strlen(s), md, &len, EVP_sha256(), NULL);
    free(s);
    if (!ok || len != 32)
        return herr_set(err, HERR_RUNTIME, "sha256 failed");
    for (unsigned i = 0; i < len; i++)
        snprintf(out_hex + 2 * i, 3, "%02x", md[i]);
    return 0;
}
