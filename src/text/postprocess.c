/* text/postprocess.c — tokenizer.json post-processors: TemplateProcessing (single), BertProcessing/RobertaProcessing, ByteLevel, Sequence. */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

enum pp_kind { PP_TEMPLATE, PP_NOTHING, PP_SEQUENCE };

struct pp_item {
    bool is_sequence; /* $A; otherwise the special token's ids */
    int32_t *ids;     /* owned */
    size_t n_ids;
};

struct postproc {
    enum pp_kind kind;
    struct pp_item *items; /* owned; the single-sequence template */
    size_t n_items;
    void **subs; /* owned; Sequence members, each a struct postproc * */
    size_t n_subs;
};

void postproc_free(struct postproc *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n_items; i++)
        free(p->items[i].ids);
    free(p->items);
    for (size_t i = 0; i < p->n_subs; i++)
        postproc_free(p->subs[i]);
    free(p->subs);
    free(p);
}

static int template_item(const struct json_reader *item, const struct json_reader *specials,
                         struct pp_item *out, struct err *err)
{
    if (json_reader_has_key(item, "Sequence")) {
        out->is_sequence = true;
        return 0;
    }
    struct json_reader tok = json_reader_member(item, "SpecialToken"), sp, ids;
    const char *id;
    size_t n;
    if (!tok.v)
        return json_reader_fail(item, INFERD_EFORMAT, "must be a Sequence or a SpecialToken");
    int rc = json_read_str(&tok, "id", JSON_REQUIRED, &id, NULL);
    if (rc)
        return rc;
    sp = json_reader_member(specials, id);
    if (!json_reader_has(&sp, "ids"))
        return json_reader_fail_plain(item, INFERD_EFORMAT,
                                      "TemplateProcessing special token '%.60s' has no ids", id);
    if ((rc = json_read_array(&sp, "ids", JSON_REQUIRED, &ids, &n)))
        return rc;
    out->ids = calloc(n ? n : 1, sizeof *out->ids);
    if (!out->ids)
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < n; i++) {
        struct json_reader e = json_reader_element(&ids, i);
        int64_t x = 0;
        if ((rc = tok_json_index(&e, NULL, JSON_REQUIRED, INT32_MAX, &x)))
            return rc;
        out->ids[out->n_ids++] = (int32_t)x;
    }
    return 0;
}

/* BertProcessing/RobertaProcessing "cls"/"sep": ["[CLS]", 101]. */
static int pair_id(const struct json_reader *j, const char *key, struct pp_item *out,
                   struct err *err)
{
    struct json_reader pair;
    size_t n;
    int64_t id = 0;
    int rc = json_read_array(j, key, JSON_REQUIRED, &pair, &n);
    if (rc)
        return rc;
    if (n != 2)
        return json_reader_fail(&pair, INFERD_EFORMAT, "must be [token, id]");
    struct json_reader e = json_reader_element(&pair, 1);
    if ((rc = tok_json_index(&e, NULL, JSON_REQUIRED, INT32_MAX, &id)))
        return rc;
    if (!(out->ids = malloc(sizeof *out->ids)))
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
    out->ids[0] = (int32_t)id;
    out->n_ids = 1;
    return 0;
}

/* A Sequence member, for tok_json_components. */
static int parse_member(const struct json_reader *e, void **out, struct err *err)
{
    struct postproc *sub = NULL;
    int rc = postproc_parse(e, &sub, err);
    *out = sub;
    return rc;
}

int postproc_parse(const struct json_reader *j, struct postproc **out, struct err *err)
{
    *out = NULL;
    const char *type;
    int rc = tok_json_type(j, &type);
    if (rc)
        return rc;
    struct postproc *p = calloc(1, sizeof *p);
    if (!p)
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
    if (!strcmp(type, "TemplateProcessing")) {
        p->kind = PP_TEMPLATE;
        struct json_reader single, specials = json_reader_member(j, "special_tokens");
        size_t n = 0;
        rc = json_read_array(j, "single", JSON_REQUIRED, &single, &n);
        if (!rc && n && !(p->items = calloc(n, sizeof *p->items)))
            rc = err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
        for (size_t i = 0; !rc && i < n; i++) {
            struct json_reader e = json_reader_element(&single, i);
            rc = template_item(&e, &specials, &p->items[i], err);
            p->n_items++;
        }
    } else if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        p->kind = PP_TEMPLATE;
        if (!(p->items = calloc(3, sizeof *p->items)))
            rc = err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
        if (!rc) {
            p->n_items = 3;
            p->items[1].is_sequence = true;
            rc = pair_id(j, "cls", &p->items[0], err);
        }
        if (!rc)
            rc = pair_id(j, "sep", &p->items[2], err);
    } else if (!strcmp(type, "ByteLevel")) {
        p->kind = PP_NOTHING;
    } else if (!strcmp(type, "Sequence")) {
        p->kind = PP_SEQUENCE;
        rc = tok_json_components(j, "processors", parse_member, &p->subs, &p->n_subs, err);
    } else {
        rc = err_set(err, INFERD_EUNSUPPORTED,
                     "tokenizer: unsupported post_processor type '%.60s'", type);
    }
    if (rc) {
        postproc_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

int postproc_apply(const struct postproc *p, const struct idlist *in, struct idlist *out,
                   struct err *err)
{
    int rc = 0;
    out->n = 0;
    switch (p->kind) {
    case PP_NOTHING:
        for (size_t i = 0; !rc && i < in->n; i++)
            rc = idlist_push(out, in->v[i], err);
        return rc;
    case PP_TEMPLATE:
        for (size_t k = 0; !rc && k < p->n_items; k++) {
            const struct pp_item *it = &p->items[k];
            if (it->is_sequence)
                for (size_t i = 0; !rc && i < in->n; i++)
                    rc = idlist_push(out, in->v[i], err);
            else
                for (size_t i = 0; !rc && i < it->n_ids; i++)
                    rc = idlist_push(out, it->ids[i], err);
        }
        return rc;
    case PP_SEQUENCE: {
        struct idlist cur = {0};
        for (size_t i = 0; !rc && i < in->n; i++)
            rc = idlist_push(&cur, in->v[i], err);
        for (size_t s = 0; !rc && s < p->n_subs; s++) {
            struct idlist nx = {0};
            rc = postproc_apply(p->subs[s], &cur, &nx, err);
            free(cur.v);
            cur = nx;
        }
        for (size_t i = 0; !rc && i < cur.n; i++)
            rc = idlist_push(out, cur.v[i], err);
        free(cur.v);
        return rc;
    }
    }
    return rc;
}
