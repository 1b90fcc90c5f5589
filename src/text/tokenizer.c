/* text/tokenizer.c — loading tokenizer.json (+ tokenizer_config.json) and the encode/decode drivers that run its pipeline. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "text/tok_internal.h"
#include "text/tokenizer.h"

struct tokenizer {
    struct bpe *model;          /* owned */
    struct normalizer *norm;    /* owned; NULL when none */
    struct pretok *pre;         /* owned; NULL when none */
    struct postproc *post;      /* owned; NULL when none */
    struct decoder *dec;        /* owned; NULL when none (tokens are joined with spaces) */
    struct added_token *added;  /* owned; n_added */
    size_t n_added;
    struct added_matcher *raw_matcher;  /* owned; normalized:false tokens, matched on raw text */
    struct added_matcher *norm_matcher; /* owned; normalized:true tokens, matched after the normalizer */
    int32_t *added_index; /* owned; per id: index into added, or -1; vocab_size entries */
    int vocab_size;
    char *bos, *eos, *pad;  /* owned; from tokenizer_config.json / special_tokens_map.json */
    char *chat_template;    /* owned */
};

/* ------------------------------------------------------------ json helpers */

int tok_json_str(json_object *j, const char *key, const char **out, size_t *len, bool required,
                 const char *ctx, struct err *err)
{
    json_object *v = NULL;
    *out = NULL;
    *len = 0;
    if (!json_object_object_get_ex(j, key, &v) || !v) {
        if (required)
            return err_set(err, INFERD_EFORMAT, "tokenizer: %s needs a string '%s'", ctx, key);
        return 0;
    }
    if (!json_object_is_type(v, json_type_string))
        return err_set(err, INFERD_EFORMAT, "tokenizer: %s '%s' must be a string", ctx, key);
    *out = json_object_get_string(v);
    *len = (size_t)json_object_get_string_len(v);
    return 0;
}

int tok_json_bool(json_object *j, const char *key, bool dflt, bool *out, const char *ctx,
                  struct err *err)
{
    json_object *v = NULL;
    *out = dflt;
    if (!json_object_object_get_ex(j, key, &v) || !v)
        return 0;
    if (!json_object_is_type(v, json_type_boolean))
        return err_set(err, INFERD_EFORMAT, "tokenizer: %s '%s' must be a boolean", ctx, key);
    *out = json_object_get_boolean(v);
    return 0;
}

int tok_json_type(json_object *j, const char *ctx, const char **out, struct err *err)
{
    size_t n;
    if (!json_object_is_type(j, json_type_object))
        return err_set(err, INFERD_EFORMAT, "tokenizer: %s must be an object", ctx);
    return tok_json_str(j, "type", out, &n, true, ctx, err);
}

static json_object *parse_json(const char *text, size_t len, const char *what, struct err *err)
{
    if (len > INT_MAX) {
        err_set(err, INFERD_EFORMAT, "tokenizer: %s is too large", what);
        return NULL;
    }
    json_tokener *jt = json_tokener_new_ex(64);
    if (!jt) {
        err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
        return NULL;
    }
    json_object *root = json_tokener_parse_ex(jt, text, (int)len);
    enum json_tokener_error je = json_tokener_get_error(jt);
    if (!root || je != json_tokener_success) {
        err_set(err, INFERD_EFORMAT, "tokenizer: %s is not valid JSON: %s", what,
                je == json_tokener_continue ? "truncated" : json_tokener_error_desc(je));
        json_object_put(root);
        root = NULL;
    }
    json_tokener_free(jt);
    return root;
}

/* ------------------------------------------------------------ loading */

void tok_free(struct tokenizer *tok)
{
    if (!tok)
        return;
    bpe_free(tok->model);
    normalizer_free(tok->norm);
    pretok_free(tok->pre);
    postproc_free(tok->post);
    decoder_free(tok->dec);
    for (size_t i = 0; i < tok->n_added; i++)
        free(tok->added[i].content);
    free(tok->added);
    added_matcher_free(tok->raw_matcher);
    added_matcher_free(tok->norm_matcher);
    free(tok->added_index);
    free(tok->bos);
    free(tok->eos);
    free(tok->pad);
    free(tok->chat_template);
    free(tok);
}

static int parse_added(struct tokenizer *tok, json_object *arr, struct err *err)
{
    if (!arr)
        return 0;
    if (!json_object_is_type(arr, json_type_array))
        return err_set(err, INFERD_EFORMAT, "tokenizer: added_tokens must be an array");
    size_t n = json_object_array_length(arr);
    if (!n)
        return 0;
    if (!(tok->added = calloc(n, sizeof *tok->added)))
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < n; i++) {
        json_object *e = json_object_array_get_idx(arr, i), *idv;
        struct added_token *t = &tok->added[i];
        const char *c;
        int rc;
        if (!json_object_is_type(e, json_type_object) || !json_object_object_get_ex(e, "id", &idv) ||
            !json_object_is_type(idv, json_type_int) || json_object_get_int64(idv) < 0 ||
            json_object_get_int64(idv) >= (1 << 26))
            return err_set(err, INFERD_EFORMAT, "tokenizer: added token %zu needs a valid id", i);
        t->id = (int32_t)json_object_get_int64(idv);
        if ((rc = tok_json_str(e, "content", &c, &t->len, true, "added token", err)) ||
            (rc = tok_json_bool(e, "special", false, &t->special, "added token", err)) ||
            (rc = tok_json_bool(e, "lstrip", false, &t->lstrip, "added token", err)) ||
            (rc = tok_json_bool(e, "rstrip", false, &t->rstrip, "added token", err)) ||
            (rc = tok_json_bool(e, "single_word", false, &t->single_word, "added token", err)) ||
            (rc = tok_json_bool(e, "normalized", !t->special, &t->normalized, "added token", err)))
            return rc;
        if (!(t->content = malloc(t->len + 1)))
            return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
        memcpy(t->content, c, t->len + 1);
        tok->n_added++;
    }
    return 0;
}

static int parse_model(struct tokenizer *tok, json_object *root, struct err *err)
{
    json_object *model;
    if (!json_object_object_get_ex(root, "model", &model) || !model)
        return err_set(err, INFERD_EFORMAT, "tokenizer: tokenizer.json has no model");
    if (!json_object_is_type(model, json_type_object))
        return err_set(err, INFERD_EFORMAT, "tokenizer: model must be an object");
    const char *type;
    size_t n;
    int rc = tok_json_str(model, "type", &type, &n, false, "model", err);
    if (rc)
        return rc;
    if (type && strcmp(type, "BPE"))
        return err_set(err, INFERD_EUNSUPPORTED,
                       "tokenizer: model type '%.60s' is not supported (only BPE)", type);
    if (!type && !json_object_object_get_ex(model, "merges", NULL))
        return err_set(err, INFERD_EUNSUPPORTED,
                       "tokenizer: model has no type and is not BPE (only BPE is supported)");
    return bpe_parse(model, &tok->model, err);
}

static int optional_component(json_object *root, const char *key, json_object **out)
{
    *out = NULL;
    json_object_object_get_ex(root, key, out);
    return 0;
}

/* bos_token etc. may be a string or an AddedToken object {"content": ...}. */
static int config_token(json_object *cfg, const char *key, char **out, struct err *err)
{
    json_object *v;
    if (*out || !cfg || !json_object_object_get_ex(cfg, key, &v) || !v)
        return 0;
    if (json_object_is_type(v, json_type_object))
        json_object_object_get_ex(v, "content", &v);
    if (!v || !json_object_is_type(v, json_type_string))
        return 0;
    if (!(*out = strdup(json_object_get_string(v))))
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
    return 0;
}

static int parse_config(struct tokenizer *tok, json_object *cfg, struct err *err)
{
    int rc;
    if ((rc = config_token(cfg, "bos_token", &tok->bos, err)) ||
        (rc = config_token(cfg, "eos_token", &tok->eos, err)) ||
        (rc = config_token(cfg, "pad_token", &tok->pad, err)))
        return rc;
    json_object *ct;
    if (!json_object_object_get_ex(cfg, "chat_template", &ct) || !ct)
        return 0;
    const char *tmpl = NULL;
    if (json_object_is_type(ct, json_type_string)) {
        tmpl = json_object_get_string(ct);
    } else if (json_object_is_type(ct, json_type_array)) {
        for (size_t i = 0; i < json_object_array_length(ct); i++) {
            json_object *e = json_object_array_get_idx(ct, i), *name, *t;
            if (json_object_object_get_ex(e, "name", &name) &&
                json_object_is_type(name, json_type_string) &&
                !strcmp(json_object_get_string(name), "default") &&
                json_object_object_get_ex(e, "template", &t) &&
                json_object_is_type(t, json_type_string))
                tmpl = json_object_get_string(t);
        }
    } else {
        return err_set(err, INFERD_EFORMAT,
                       "tokenizer: chat_template must be a string or a list of templates");
    }
    if (tmpl && !(tok->chat_template = strdup(tmpl)))
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
    return 0;
}

static int build(struct tokenizer *tok, json_object *root, struct err *err)
{
    if (!json_object_is_type(root, json_type_object))
        return err_set(err, INFERD_EFORMAT, "tokenizer: tokenizer.json must be an object");
    json_object *added = NULL, *c;
    json_object_object_get_ex(root, "added_tokens", &added);
    int rc = parse_model(tok, root, err);
    if (!rc)
        rc = parse_added(tok, added, err);
    if (!rc && !optional_component(root, "normalizer", &c) && c)
        rc = normalizer_parse(c, &tok->norm, err);
    if (!rc && !optional_component(root, "pre_tokenizer", &c) && c)
        rc = pretok_parse(c, &tok->pre, err);
    if (!rc && !optional_component(root, "post_processor", &c) && c)
        rc = postproc_parse(c, &tok->post, err);
    if (!rc && !optional_component(root, "decoder", &c) && c)
        rc = decoder_parse(c, &tok->dec, err);
    if (!rc)
        rc = added_matcher_build(tok->added, tok->n_added, false, NULL, &tok->raw_matcher, err);
    if (!rc)
        rc = added_matcher_build(tok->added, tok->n_added, true, tok->norm, &tok->norm_matcher,
                                 err);
    if (rc)
        return rc;
    int32_t max_id = bpe_max_id(tok->model);
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].id > max_id)
            max_id = tok->added[i].id;
    tok->vocab_size = max_id + 1;
    tok->added_index = malloc(((size_t)tok->vocab_size + 1) * sizeof *tok->added_index);
    if (!tok->added_index)
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
    memset(tok->added_index, 0xff, ((size_t)tok->vocab_size + 1) * sizeof *tok->added_index);
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added_index[tok->added[i].id] < 0)
            tok->added_index[tok->added[i].id] = (int32_t)i;
    return 0;
}

static int load_all(const char *json, size_t len, const char *config, size_t config_len,
                    const char *special_map, size_t special_len, struct tokenizer **out,
                    struct err *err)
{
    struct err local = {0};
    if (!err)
        err = &local;
    *out = NULL;
    if (!json)
        return err_set(err, INFERD_EINVAL, "tokenizer: no tokenizer.json text");
    struct tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok)
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
    int rc = 0;
    json_object *root = parse_json(json, len, "tokenizer.json", err);
    if (!root)
        rc = -err->code;
    if (!rc)
        rc = build(tok, root, err);
    json_object_put(root);
    if (!rc && config) {
        json_object *cfg = parse_json(config, config_len, "tokenizer_config.json", err);
        if (!cfg)
            rc = -err->code;
        else if (!json_object_is_type(cfg, json_type_object))
            rc = err_set(err, INFERD_EFORMAT, "tokenizer: tokenizer_config.json must be an object");
        else
            rc = parse_config(tok, cfg, err);
        json_object_put(cfg);
    }
    if (!rc && special_map) {
        json_object *sm = parse_json(special_map, special_len, "special_tokens_map.json", err);
        if (!sm)
            rc = -err->code;
        else if (json_object_is_type(sm, json_type_object)) {
            rc = config_token(sm, "bos_token", &tok->bos, err);
            if (!rc)
                rc = config_token(sm, "eos_token", &tok->eos, err);
            if (!rc)
                rc = config_token(sm, "pad_token", &tok->pad, err);
        }
        json_object_put(sm);
    }
    if (rc) {
        tok_free(tok);
        return rc;
    }
    *out = tok;
    return 0;
}

int tok_load_json(const char *tokenizer_json, size_t len, const char *config_json,
                  size_t config_len, struct tokenizer **out, struct err *err)
{
    return load_all(tokenizer_json, len, config_json, config_len, NULL, 0, out, err);
}

int tok_load(const char *dir, struct tokenizer **out, struct err *err)
{
    struct err local = {0};
    if (!err)
        err = &local;
    *out = NULL;
    char path[4096];
    char *json = NULL, *cfg = NULL, *sm = NULL;
    size_t len = 0, cfg_len = 0, sm_len = 0;
    bool missing = false;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    int rc = file_read_all(path, (size_t)1 << 30, &json, &len, NULL, err);
    if (!rc) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        rc = file_read_all(path, (size_t)256 << 20, &cfg, &cfg_len, &missing, err);
    }
    if (!rc) {
        snprintf(path, sizeof path, "%s/special_tokens_map.json", dir);
        rc = file_read_all(path, (size_t)64 << 20, &sm, &sm_len, &missing, err);
    }
    if (!rc)
        rc = load_all(json, len, cfg, cfg_len, sm, sm_len, out, err);
    if (rc)
        err_wrap(err, "loading tokenizer from %s", dir);
    free(json);
    free(cfg);
    free(sm);
    return rc;
}

/* ------------------------------------------------------------ encoding */

static int encode_text_segment(const struct tokenizer *tok, const char *s, size_t len, bool first,
                               struct idlist *ids, struct err *err)
{
    struct plist pl = {0};
    int rc = plist_push(&pl, s, len, first, err);
    if (!rc && tok->pre)
        rc = pretok_apply(tok->pre, &pl, err);
    for (size_t i = 0; !rc && i < pl.n; i++)
        rc = bpe_encode_word(tok->model, pl.v[i].s, pl.v[i].len, ids, err);
    plist_free(&pl);
    return rc;
}

/* A run of text between raw-matched added tokens: normalize, then split out
 * normalized added tokens, then pre-tokenize and run the model. */
static int encode_run(const struct tokenizer *tok, const char *s, size_t len, bool first,
                      struct idlist *ids, struct err *err)
{
    struct tbuf t = {0};
    int rc = tbuf_put(&t, s, len, err);
    if (!rc && tok->norm)
        rc = normalizer_apply(tok->norm, &t, err);
    if (rc || t.len == 0) {
        tbuf_free(&t);
        return rc;
    }
    if (added_matcher_empty(tok->norm_matcher)) {
        rc = encode_text_segment(tok, t.p, t.len, first, ids, err);
    } else {
        struct spanlist sp = {0};
        struct idlist which = {0};
        rc = added_matcher_split(tok->norm_matcher, tok->added, t.p, t.len, &sp, &which, err);
        for (size_t i = 0, k = 0; !rc && i < sp.n; i++) {
            if (sp.v[i].is_match)
                rc = idlist_push(ids, tok->added[which.v[k++]].id, err);
            else
                rc = encode_text_segment(tok, t.p + sp.v[i].start, sp.v[i].end - sp.v[i].start,
                                         first && sp.v[i].start == 0, ids, err);
        }
        free(sp.v);
        free(which.v);
    }
    tbuf_free(&t);
    return rc;
}

int tok_encode(const struct tokenizer *tok, const char *text, size_t len, bool add_special,
               int32_t **ids_out, int *n_ids, struct err *err)
{
    *ids_out = NULL;
    *n_ids = 0;
    if (!text && len)
        return err_set(err, INFERD_EINVAL, "tokenizer: NULL text");
    struct tbuf t = {0};
    struct idlist ids = {0}, post = {0};
    struct spanlist sp = {0};
    struct idlist which = {0};
    int rc = tok_utf8_lossy(text ? text : "", len, &t, err);
    if (!rc)
        rc = added_matcher_split(tok->raw_matcher, tok->added, t.p, t.len, &sp, &which, err);
    for (size_t i = 0, k = 0; !rc && i < sp.n; i++) {
        if (sp.v[i].is_match)
            rc = idlist_push(&ids, tok->added[which.v[k++]].id, err);
        else
            rc = encode_run(tok, t.p + sp.v[i].start, sp.v[i].end - sp.v[i].start,
                            sp.v[i].start == 0, &ids, err);
    }
    if (!rc && add_special && tok->post) {
        rc = postproc_apply(tok->post, &ids, &post, err);
        if (!rc) {
            free(ids.v);
            ids = post;
            post = (struct idlist){0};
        }
    }
    if (!rc && ids.n > INT_MAX)
        rc = err_set(err, INFERD_ERANGE, "tokenizer: too many tokens");
    if (!rc && !ids.v && !(ids.v = malloc(sizeof *ids.v)))
        rc = err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
    tbuf_free(&t);
    free(sp.v);
    free(which.v);
    free(post.v);
    if (rc) {
        free(ids.v);
        return rc;
    }
    *ids_out = ids.v;
    *n_ids = (int)ids.n;
    return 0;
}

/* ------------------------------------------------------------ decoding */

static const struct added_token *added_for(const struct tokenizer *tok, int32_t id)
{
    if (id < 0 || id >= tok->vocab_size || tok->added_index[id] < 0)
        return NULL;
    return &tok->added[tok->added_index[id]];
}

int tok_decode(const struct tokenizer *tok, const int32_t *ids, int n_ids, bool skip_special,
               char **text, size_t *len, struct err *err)
{
    *text = NULL;
    if (len)
        *len = 0;
    if (n_ids < 0 || (!ids && n_ids))
        return err_set(err, INFERD_EINVAL, "tokenizer: bad id list");
    struct plist pl = {0};
    struct tbuf out = {0};
    int rc = tbuf_put(&out, "", 0, err);
    for (int i = 0; !rc && i < n_ids; i++) {
        const struct added_token *a = added_for(tok, ids[i]);
        if (a) {
            if (!(skip_special && a->special))
                rc = plist_push(&pl, a->content, a->len, false, err);
            continue;
        }
        const char *p = bpe_id_to_piece(tok->model, ids[i]);
        if (p)
            rc = plist_push(&pl, p, strlen(p), false, err);
    }
    if (!rc && tok->dec)
        rc = decoder_apply(tok->dec, &pl, err);
    for (size_t i = 0; !rc && i < pl.n; i++) {
        if (!tok->dec && i)
            rc = tbuf_put(&out, " ", 1, err);
        if (!rc)
            rc = tbuf_put(&out, pl.v[i].s, pl.v[i].len, err);
    }
    plist_free(&pl);
    if (rc) {
        tbuf_free(&out);
        return rc;
    }
    *text = out.p;
    if (len)
        *len = out.len;
    return 0;
}

/* ------------------------------------------------------------ queries */

bool tok_decoder_joins_byte_runs(const struct tokenizer *tok)
{
    return tok->dec && decoder_has_byte_fallback(tok->dec);
}

bool tok_id_is_byte_token(const struct tokenizer *tok, int32_t id)
{
    if (added_for(tok, id))
        return false;
    const char *p = bpe_id_to_piece(tok->model, id);
    return p && strlen(p) == 6 && !memcmp(p, "<0x", 3) && p[5] == '>';
}

int tok_vocab_size(const struct tokenizer *tok) { return tok->vocab_size; }

int32_t tok_piece_to_id(const struct tokenizer *tok, const char *piece)
{
    size_t n = strlen(piece);
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].len == n && !memcmp(tok->added[i].content, piece, n))
            return tok->added[i].id;
    return bpe_piece_to_id(tok->model, piece, n);
}

const char *tok_id_to_piece(const struct tokenizer *tok, int32_t id)
{
    const struct added_token *a = added_for(tok, id);
    return a ? a->content : bpe_id_to_piece(tok->model, id);
}

bool tok_is_special(const struct tokenizer *tok, int32_t id)
{
    const struct added_token *a = added_for(tok, id);
    return a && a->special;
}

const char *tok_bos_token(const struct tokenizer *tok) { return tok->bos; }
const char *tok_eos_token(const struct tokenizer *tok) { return tok->eos; }
const char *tok_pad_token(const struct tokenizer *tok) { return tok->pad; }
const char *tok_chat_template(const struct tokenizer *tok) { return tok->chat_template; }
