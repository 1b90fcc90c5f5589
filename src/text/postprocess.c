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
    struct postproc **subs; /* owned; Sequence members */
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

static int template_item(json_object *item, json_object *specials, struct pp_item *out,
                         struct err *err)
{
    json_object *v, *id;
    if (json_object_object_get_ex(item, "Sequence", &v)) {
        out->is_sequence = true;
        return 0;
    }
    if (!json_object_object_get_ex(item, "SpecialToken", &v) ||
        !json_object_object_get_ex(v, "id", &id) || !json_object_is_type(id, json_type_string))
        return err_set(err, INFERD_EFORMAT,
                       "tokenizer: TemplateProcessing item must be a Sequence or a SpecialToken");
    json_object *sp, *ids;
    if (!specials || !json_object_object_get_ex(specials, json_object_get_string(id), &sp) ||
        !json_object_object_get_ex(sp, "ids", &ids) || !json_object_is_type(ids, json_type_array))
        return err_set(err, INFERD_EFORMAT,
                       "tokenizer: TemplateProcessing special token '%.60s' has no ids",
                       json_object_get_string(id));
    size_t n = json_object_array_length(ids);
    out->ids = calloc(n ? n : 1, sizeof *out->ids);
    if (!out->ids)
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < n; i++) {
        json_object *e = json_object_array_get_idx(ids, i);
        if (!json_object_is_type(e, json_type_int) || json_object_get_int64(e) < 0 ||
            json_object_get_int64(e) > INT32_MAX)
            return err_set(err, INFERD_EFORMAT, "tokenizer: TemplateProcessing id is not valid");
        out->ids[out->n_ids++] = (int32_t)json_object_get_int64(e);
    }
    return 0;
}

/* BertProcessing/RobertaProcessing "cls"/"sep": ["[CLS]", 101]. */
static int pair_id(json_object *j, const char *key, struct pp_item *out, struct err *err)
{
    json_object *v, *id;
    if (!json_object_object_get_ex(j, key, &v) || !json_object_is_type(v, json_type_array) ||
        json_object_array_length(v) != 2 ||
        !json_object_is_type(id = json_object_array_get_idx(v, 1), json_type_int) ||
        json_object_get_int64(id) < 0 || json_object_get_int64(id) > INT32_MAX)
        return err_set(err, INFERD_EFORMAT, "tokenizer: post_processor %s must be [token, id]",
                       key);
    if (!(out->ids = malloc(sizeof *out->ids)))
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
    out->ids[0] = (int32_t)json_object_get_int64(id);
    out->n_ids = 1;
    return 0;
}

int postproc_parse(json_object *j, struct postproc **out, struct err *err)
{
    *out = NULL;
    const char *type;
    int rc = tok_json_type(j, "post_processor", &type, err);
    if (rc)
        return rc;
    struct postproc *p = calloc(1, sizeof *p);
    if (!p)
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
    if (!strcmp(type, "TemplateProcessing")) {
        p->kind = PP_TEMPLATE;
        json_object *single, *specials = NULL;
        json_object_object_get_ex(j, "special_tokens", &specials);
        if (!json_object_object_get_ex(j, "single", &single) ||
            !json_object_is_type(single, json_type_array))
            rc = err_set(err, INFERD_EFORMAT, "tokenizer: TemplateProcessing needs a single array");
        size_t n = rc ? 0 : json_object_array_length(single);
        if (n && !(p->items = calloc(n, sizeof *p->items)))
            rc = err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
        for (size_t i = 0; !rc && i < n; i++) {
            rc = template_item(json_object_array_get_idx(single, i), specials, &p->items[i], err);
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
        json_object *arr;
        if (!json_object_object_get_ex(j, "processors", &arr) ||
            !json_object_is_type(arr, json_type_array))
            rc = err_set(err, INFERD_EFORMAT,
                         "tokenizer: Sequence post_processor needs a processors array");
        size_t n = rc ? 0 : json_object_array_length(arr);
        if (n && !(p->subs = calloc(n, sizeof *p->subs)))
            rc = err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
        for (size_t i = 0; !rc && i < n; i++) {
            rc = postproc_parse(json_object_array_get_idx(arr, i), &p->subs[i], err);
            if (!rc)
                p->n_subs++;
        }
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
