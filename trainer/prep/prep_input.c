/* prep_input.c - reading and checking the JSONL records. */
#include "prep/prep.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static void record_free(prep_record *r)
{
    free(r->tokens);
    for (int i = 0; i < r->n_images; i++)
        free(r->images[i]);
    free(r->images);
}

void prep_records_free(prep_records *rs)
{
    for (size_t i = 0; i < rs->n; i++)
        record_free(&rs->rec[i]);
    free(rs->rec);
    memset(rs, 0, sizeof *rs);
}

/* "DIR/" of path (empty when it has none): image paths are relative to it. */
static size_t dir_len(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? (size_t)(slash - path) + 1 : 0;
}

/* Fills r from one parsed line; errors are "PATH:LINE: ...". */
static int parse_record(prep_record *r, json_t *root, const char *path, long line, int vocab,
                        int image_token_id, hearth_err *err)
{
    if (!json_is_object(root))
        return herr_set(err, HERR_CONFIG, "%s:%ld: expected a JSON object", path, line);
    json_t *toks = json_object_get(root, "tokens"), *imgs = json_object_get(root, "images");
    if (!json_is_array(toks) || json_array_size(toks) == 0)
        return herr_set(err, HERR_CONFIG, "%s:%ld: tokens: expected a non-empty array of "
                        "integers", path, line);
    if (imgs && !json_is_array(imgs))
        return herr_set(err, HERR_CONFIG, "%s:%ld: images: expected an array of file names",
                        path, line);
    size_t nt = json_array_size(toks), ni = imgs ? json_array_size(imgs) : 0;
    if (nt > INT32_MAX / 2 || ni > 65536)
        return herr_set(err, HERR_CONFIG, "%s:%ld: record too large", path, line);
    r->tokens = malloc(nt * sizeof *r->tokens);
    r->images = calloc(ni ? ni : 1, sizeof *r->images);
    if (!r->tokens || !r->images)
        return herr_set(err, HERR_NOMEM, "%s:%ld: out of memory", path, line);
    r->n_tokens = (int)nt;
    size_t placeholders = 0;
    for (size_t i = 0; i < nt; i++) {
        json_t *t = json_array_get(toks, i);
        if (!json_is_integer(t))
            return herr_set(err, HERR_CONFIG, "%s:%ld: tokens[%zu]: expected an integer",
                            path, line, i);
        json_int_t v = json_integer_value(t);
        if (v < 0 || v >= vocab)
            return herr_set(err, HERR_CONFIG, "%s:%ld: tokens[%zu]: %lld is outside the "
                            "model's vocabulary [0, %d)", path, line, i, (long long)v, vocab);
        r->tokens[i] = (int32_t)v;
        placeholders += v == image_token_id;
    }
    if (placeholders != ni)
        return herr_set(err, HERR_CONFIG, "%s:%ld: %zu image placeholder tokens (id %d) for "
                        "%zu images: need exactly one per image", path, line, placeholders,
                        image_token_id, ni);
    size_t dl = dir_len(path);
    for (size_t i = 0; i < ni; i++) {
        json_t *s = json_array_get(imgs, i);
        if (!json_is_string(s) || !json_string_length(s))
            return herr_set(err, HERR_CONFIG, "%s:%ld: images[%zu]: expected a file name",
                            path, line, i);
        const char *name = json_string_value(s);
        size_t nl = strlen(name), base = name[0] == '/' ? 0 : dl;
        char *full = malloc(base + nl + 1);
        if (!full)
            return herr_set(err, HERR_NOMEM, "%s:%ld: out of memory", path, line);
        memcpy(full, path, base);
        memcpy(full + base, name, nl + 1);
        r->images[r->n_images++] = full;
    }
    return 0;
}

int prep_read_jsonl(prep_records *rs, const char *path, int file_index, int vocab,
                    int image_token_id, hearth_err *err)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return herr_set(err, HERR_CONFIG, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0;
    long line = 0;
    int rc = 0;
    ssize_t len;
    while (!rc && (len = getline(&buf, &cap, f)) >= 0) {
        line++;
        if (strspn(buf, " \t\r\n") == (size_t)len)
            continue;               /* blank lines are allowed */
        json_error_t je;
        json_t *root = json_loadb(buf, (size_t)len, 0, &je);
        if (!root) {
            rc = herr_set(err, HERR_CONFIG, "%s:%ld:%d: bad JSON: %s", path, line, je.column,
                          je.text);
            break;
        }
        if (rs->n == rs->cap) {
            size_t ncap = rs->cap ? 2 * rs->cap : 256;
            prep_record *q = realloc(rs->rec, ncap * sizeof *q);
            if (!q) {
                json_decref(root);
                rc = herr_set(err, HERR_NOMEM, "%s: out of memory", path);
                break;
            }
            rs->rec = q;
            rs->cap = ncap;
        }
        prep_record *r = &rs->rec[rs->n];
        memset(r, 0, sizeof *r);
        r->file = file_index;
        r->line = line;
        rc = parse_record(r, root, path, line, vocab, image_token_id, err);
        json_decref(root);
        if (rc)
            record_free(r);
        else
            rs->n++;
    }
    if (!rc && ferror(f))
        rc = herr_set(err, HERR_IO, "%s: read error", path);
    free(buf);
    fclose(f);
    return rc;
}
