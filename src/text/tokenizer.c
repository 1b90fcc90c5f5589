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

int tok_json_type(const struct json_reader *j, const char **out)
{
    struct json_reader obj;
    int rc = json_read_object(j, NULL, JSON_REQUIRED, &obj);
    return rc ? rc : json_read_str(j, "type", JSON_REQUIRED, out, NULL);
}

int tok_json_index(const struct json_reader *j, const char *key, bool *present, int64_t max,
                   int64_t *out)
{
    int64_t x = *out;
    int rc = json_read_int64(j, key, present, INT64_MIN, INT64_MAX, &x);
    if (rc)
        return rc;
    if (x < 0 || x > max) {
        struct json_reader at = key ? json_reader_member(j, key) : *j;
        if (max == INT64_MAX)
            return json_reader_fail(&at, INFERD_EFORMAT, "= %lld is out of range (negative)",
                                    (long long)x);
        return json_reader_fail(&at, INFERD_EFORMAT, "= %lld is out of range (0..%lld)",
                                (long long)x, (long long)max);
    }
    *out = x;
    return 0;
}

int tok_json_components(const struct json_reader *j, const char *key,
                        int (*parse)(const struct json_reader *e, void **out, struct err *err),
                        void ***subs, size_t *n, struct err *err)
{
    struct json_reader arr;
    size_t len = 0;
    int rc = json_read_array(j, key, JSON_REQUIRED, &arr, &len);
    if (rc || !len)
        return rc;
    if (!(*subs = calloc(len, sizeof **subs)))
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < len; i++) {
        struct json_reader e = json_reader_element(&arr, i);
        if ((rc = parse(&e, &(*subs)[i], err)))
            return rc;
        (*n)++;
    }
    return 0;
}

int tok_json_char(const struct json_reader *j, const char *key, const char *dflt, uint32_t *out,
                  struct err *err)
{
    const char *s = dflt;
    size_t n = strlen(dflt);
    int rc = json_read_str(j, key, JSON_OPTIONAL, &s, &n);
    if (rc)
        return rc;
    size_t i = 0;
    struct strbuf b = {0};
    if ((rc = tok_utf8_lossy(s, n, &b, err)))
        return rc;
    *out = b.len ? tok_utf8_next(b.data, b.len, &i) : 0;
    bool one = b.len && i == b.len;
    strbuf_free(&b);
    if (!one) {
        struct json_reader at = json_reader_member(j, key);
        return json_reader_fail(&at, INFERD_EFORMAT, "must be a single character");
    }
    return 0;
}

/* Parses one of the tokenizer's files; what names it in messages. */
static json_object *parse_json(const char *text, size_t len, const char *what, struct err *err)
{
    json_object *root = NULL;
    int rc = json_text_parse(text, len, 64, false, &root, err);
    if (rc) {
        if (rc != -INFERD_ENOMEM)
            err_wrap(err, "tokenizer: %s is not valid JSON", what);
        return NULL;
    }
    if (!root)
        err_set(err, INFERD_EFORMAT, "tokenizer: %s must be an object, got null", what);
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

static int parse_added(struct tokenizer *tok, const struct json_reader *root, struct err *err)
{
    struct json_reader arr;
    size_t n;
    int rc = json_read_array(root, "added_tokens", JSON_OPTIONAL, &arr, &n);
    if (rc || !n)
        return rc;
    if (!(tok->added = calloc(n, sizeof *tok->added)))
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < n; i++) {
        struct json_reader e = json_reader_element(&arr, i), obj;
        struct added_token *t = &tok->added[tok->n_added++];
        int64_t id = 0;
        if ((rc = json_read_object(&e, NULL, JSON_REQUIRED, &obj)) ||
            (rc = tok_json_index(&e, "id", JSON_REQUIRED, (1 << 26) - 1, &id)) ||
            (rc = json_read_strdup(&e, "content", JSON_REQUIRED, &t->content, &t->len)) ||
            (rc = json_read_bool(&e, "special", JSON_OPTIONAL, &t->special)) ||
            (rc = json_read_bool(&e, "lstrip", JSON_OPTIONAL, &t->lstrip)) ||
            (rc = json_read_bool(&e, "rstrip", JSON_OPTIONAL, &t->rstrip)) ||
            (rc = json_read_bool(&e, "single_word", JSON_OPTIONAL, &t->single_word)))
            return rc;
        t->id = (int32_t)id;
        t->normalized = !t->special;
        if ((rc = json_read_bool(&e, "normalized", JSON_OPTIONAL, &t->normalized)))
            return rc;
    }
    return 0;
}

static int parse_model(struct tokenizer *tok, const struct json_reader *root, struct err *err)
{
    struct json_reader model;
    const char *type = NULL;
    if (!json_reader_has(root, "model"))
        return json_reader_fail_plain(root, INFERD_EFORMAT, "tokenizer.json has no model");
    int rc = json_read_object(root, "model", JSON_REQUIRED, &model);
    if (!rc)
        rc = json_read_str(&model, "type", JSON_OPTIONAL, &type, NULL);
    if (rc)
        return rc;
    if (type && strcmp(type, "BPE"))
        return err_set(err, INFERD_EUNSUPPORTED,
                       "tokenizer: model type '%.60s' is not supported (only BPE)", type);
    if (!type && !json_reader_has_key(&model, "merges"))
        return err_set(err, INFERD_EUNSUPPORTED,
                       "tokenizer: model has no type and is not BPE (only BPE is supported)");
    return bpe_parse(&model, &tok->model, err);
}

/* bos_token etc. may be a string or an AddedToken object {"content": ...};
 * other values are ignored, as transformers does. */
static int config_token(const struct json_reader *cfg, const char *key, char **out)
{
    struct json_reader v = json_reader_member(cfg, key);
    if (*out || !v.v)
        return 0;
    if (json_object_is_type(v.v, json_type_object))
        v = json_reader_member(&v, "content");
    if (!v.v || !json_object_is_type(v.v, json_type_string))
        return 0;
    return json_read_strdup(&v, NULL, JSON_REQUIRED, out, NULL);
}

static int config_tokens(struct tokenizer *tok, const struct json_reader *cfg)
{
    int rc;
    if ((rc = config_token(cfg, "bos_token", &tok->bos)) ||
        (rc = config_token(cfg, "eos_token", &tok->eos)) ||
        (rc = config_token(cfg, "pad_token", &tok->pad)))
        return rc;
    return 0;
}

/* chat_template: a string, or a list of {name, template} of which "default" is used. */
static int parse_config(struct tokenizer *tok, const struct json_reader *cfg)
{
    int rc = config_tokens(tok, cfg);
    if (rc)
        return rc;
    struct json_reader ct = json_reader_member(cfg, "chat_template");
    const char *tmpl = NULL;
    if (!ct.v)
        return 0;
    if (json_object_is_type(ct.v, json_type_string)) {
        tmpl = json_object_get_string(ct.v);
    } else if (json_object_is_type(ct.v, json_type_array)) {
        for (size_t i = 0; i < json_object_array_length(ct.v); i++) {
            struct json_reader e = json_reader_element(&ct, i);
            struct json_reader name = json_reader_member(&e, "name");
            struct json_reader t = json_reader_member(&e, "template");
            if (json_object_is_type(name.v, json_type_string) &&
                !strcmp(json_object_get_string(name.v), "default") &&
                json_object_is_type(t.v, json_type_string))
                tmpl = json_object_get_string(t.v);
        }
    } else {
        return json_reader_fail(&ct, INFERD_EFORMAT, "must be a string or a list of templates");
    }
    if (tmpl && !(tok->chat_template = strdup(tmpl)))
        return json_reader_fail_plain(&ct, INFERD_ENOMEM, "out of memory");
    return 0;
}

static int build(struct tokenizer *tok, const struct json_reader *root, struct err *err)
{
    struct json_reader obj, c;
    int rc = json_read_object(root, NULL, JSON_REQUIRED, &obj);
    if (!rc)
        rc = parse_model(tok, root, err);
    if (!rc)
        rc = parse_added(tok, root, err);
    if (!rc && (c = json_reader_member(root, "normalizer")).v)
        rc = normalizer_parse(&c, &tok->norm, err);
    if (!rc && (c = json_reader_member(root, "pre_tokenizer")).v)
        rc = pretok_parse(&c, &tok->pre, err);
    if (!rc && (c = json_reader_member(root, "post_processor")).v)
        rc = postproc_parse(&c, &tok->post, err);
    if (!rc && (c = json_reader_member(root, "decoder")).v)
        rc = decoder_parse(&c, &tok->dec, err);
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
    struct json_doc doc = {.err = err, .prefix = "tokenizer", .name = "tokenizer.json"};
    json_object *root = parse_json(json, len, "tokenizer.json", err);
    if (!root)
        rc = -err->code;
    if (!rc) {
        struct json_reader r = json_reader_root(&doc, root);
        rc = build(tok, &r, err);
    }
    json_object_put(root);
    if (!rc && config) {
        doc.name = "tokenizer_config.json";
        json_object *cfg = parse_json(config, config_len, doc.name, err);
        struct json_reader r = json_reader_root(&doc, cfg), obj;
        if (!cfg)
            rc = -err->code;
        else if (!(rc = json_read_object(&r, NULL, JSON_REQUIRED, &obj)))
            rc = parse_config(tok, &r);
        json_object_put(cfg);
    }
    if (!rc && special_map) {
        doc.name = "special_tokens_map.json";
        json_object *sm = parse_json(special_map, special_len, doc.name, err);
        struct json_reader r = json_reader_root(&doc, sm);
        if (!sm)
            rc = -err->code;
        else
            rc = config_tokens(tok, &r);
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
    struct strbuf t = {0};
    int rc = tok_put(&t, s, len, err);
    if (!rc && tok->norm)
        rc = normalizer_apply(tok->norm, &t, err);
    if (rc || t.len == 0) {
        strbuf_free(&t);
        return rc;
    }
    if (added_matcher_empty(tok->norm_matcher)) {
        rc = encode_text_segment(tok, t.data, t.len, first, ids, err);
    } else {
        struct spanlist sp = {0};
        struct idlist which = {0};
        rc = added_matcher_split(tok->norm_matcher, tok->added, t.data, t.len, &sp, &which, err);
        for (size_t i = 0, k = 0; !rc && i < sp.n; i++) {
            if (sp.v[i].is_match)
                rc = idlist_push(ids, tok->added[which.v[k++]].id, err);
            else
                rc = encode_text_segment(tok, t.data + sp.v[i].start, sp.v[i].end - sp.v[i].start,
                                         first && sp.v[i].start == 0, ids, err);
        }
        free(sp.v);
        free(which.v);
    }
    strbuf_free(&t);
    return rc;
}

int tok_encode(const struct tokenizer *tok, const char *text, size_t len, bool add_special,
               int32_t **ids_out, int *n_ids, struct err *err)
{
    *ids_out = NULL;
    *n_ids = 0;
    if (!text && len)
        return err_set(err, INFERD_EINVAL, "tokenizer: NULL text");
    struct strbuf t = {0};
    struct idlist ids = {0}, post = {0};
    struct spanlist sp = {0};
    struct idlist which = {0};
    int rc = tok_utf8_lossy(text ? text : "", len, &t, err);
    if (!rc)
        rc = added_matcher_split(tok->raw_matcher, tok->added, t.data, t.len, &sp, &which, err);
    for (size_t i = 0, k = 0; !rc && i < sp.n; i++) {
        if (sp.v[i].is_match)
            rc = idlist_push(&ids, tok->added[which.v[k++]].id, err);
        else
            rc = encode_run(tok, t.data + sp.v[i].start, sp.v[i].end - sp.v[i].start,
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
    strbuf_free(&t);
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
    struct strbuf out = {0};
    int rc = tok_put(&out, "", 0, err);
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
            rc = tok_put(&out, " ", 1, err);
        if (!rc)
            rc = tok_put(&out, pl.v[i].s, pl.v[i].len, err);
    }
    plist_free(&pl);
    if (rc) {
        strbuf_free(&out);
        return rc;
    }
    *text = out.data;
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
