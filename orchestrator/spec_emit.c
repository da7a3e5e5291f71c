/* spec_emit.c - a YAML tree written out through libyaml's emitter.  See spec_emit.h. */
#include "spec_emit.h"

#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "strbuf.h"

/* The text so far; nomem: an append failed (the emitter's handler can only say "stop"). */
typedef struct {
    strbuf b;
    int nomem;
} out_buf;

static int append(out_buf *o, const char *data, size_t n)
{
    if (strbuf_add(&o->b, data, n)) {
        o->nomem = 1;
        return -1;
    }
    return 0;
}

static int write_handler(void *data, unsigned char *buffer, size_t size)
{
    return append(data, (const char *)buffer, size) == 0;
}

/* A list is written in flow style when every item is a non-empty scalar or such a list:
 * an empty plain scalar (null) cannot be written plain inside a flow list. */
static int flow_ok(const yaml_tree_node *n)
{
    if (n->kind == YAML_TREE_SCALAR)
        return n->len > 0;
    if (n->kind == YAML_TREE_MAP)
        return 0;
    for (int i = 0; i < n->n_items; i++)
        if (!flow_ok(n->items[i]))
            return 0;
    return 1;
}

static int emit_scalar(yaml_emitter_t *em, const char *text, size_t len, int quoted)
{
    yaml_event_t ev;
    yaml_scalar_style_t style = quoted ? YAML_DOUBLE_QUOTED_SCALAR_STYLE : YAML_PLAIN_SCALAR_STYLE;
    if (!yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)text, (int)len, !quoted,
                                      1, style))
        return -1;
    return yaml_emitter_emit(em, &ev) ? 0 : -1;
}

static int emit_node(yaml_emitter_t *em, const yaml_tree_node *n, int flow)
{
    yaml_event_t ev;
    switch (n->kind) {
    case YAML_TREE_SCALAR:
        return emit_scalar(em, n->text ? n->text : "", n->text ? n->len : 0, n->quoted);
    case YAML_TREE_SEQ:
        flow = flow || flow_ok(n);
        if (!yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1,
                                                  flow ? YAML_FLOW_SEQUENCE_STYLE
                                                       : YAML_BLOCK_SEQUENCE_STYLE) ||
            !yaml_emitter_emit(em, &ev))
            return -1;
        for (int i = 0; i < n->n_items; i++)
            if (emit_node(em, n->items[i], flow))
                return -1;
        if (!yaml_sequence_end_event_initialize(&ev) || !yaml_emitter_emit(em, &ev))
            return -1;
        return 0;
    case YAML_TREE_MAP:
        if (!yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_MAPPING_STYLE) ||
            !yaml_emitter_emit(em, &ev))
            return -1;
        for (int i = 0; i < n->n_pairs; i++)
            if (emit_scalar(em, n->pairs[i].key, strlen(n->pairs[i].key), 0) ||
                emit_node(em, n->pairs[i].value, 0))
                return -1;
        if (!yaml_mapping_end_event_initialize(&ev) || !yaml_emitter_emit(em, &ev))
            return -1;
        return 0;
    }
    return -1;
}

static int emit_document(yaml_emitter_t *em, const yaml_tree_node *root)
{
    yaml_event_t ev;
    if (!yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING) || !yaml_emitter_emit(em, &ev) ||
        !yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1) ||
        !yaml_emitter_emit(em, &ev))
        return -1;
    if (root ? emit_node(em, root, 0) : emit_scalar(em, "", 0, 0))
        return -1;
    if (!yaml_document_end_event_initialize(&ev, 1) || !yaml_emitter_emit(em, &ev) ||
        !yaml_stream_end_event_initialize(&ev) || !yaml_emitter_emit(em, &ev) ||
        !yaml_emitter_flush(em))
        return -1;
    return 0;
}

int spec_emit(const yaml_tree_node *root, const char *header, char **out, hearth_err *err)
{
    out_buf o = { 0 };
    *out = NULL;
    /* the header as comments: one "# " per line, so that no line of it escapes */
    for (const char *p = header; p && *p;) {
        size_t n = strcspn(p, "\n");
        if (append(&o, "# ", 2) || append(&o, p, n) || append(&o, "\n", 1))
            break;
        p += n + (p[n] == '\n');
    }
    yaml_emitter_t em;
    if (o.nomem || !yaml_emitter_initialize(&em)) {
        free(o.b.s);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    yaml_emitter_set_output(&em, write_handler, &o);
    yaml_emitter_set_unicode(&em, 1);
    yaml_emitter_set_width(&em, -1);
    yaml_emitter_set_indent(&em, 2);
    int rc = emit_document(&em, root);
    const char *problem = em.problem;
    yaml_emitter_delete(&em);
    if (rc || o.nomem) {
        free(o.b.s);
        if (o.nomem)
            return herr_set(err, HERR_NOMEM, "out of memory");
        return herr_set(err, HERR_RUNTIME, "writing the spec as YAML: %s",
                        problem ? problem : "the emitter failed");
    }
    *out = o.b.s;
    return 0;
}
