/* text/tok_gguf.c — a tokenizer from GGUF's tokenizer.ggml.* metadata, built as the tokenizer.json Hugging Face would ship for it, so both encode alike. */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

/* tokenizer.ggml.token_type values. */
enum { TYPE_NORMAL = 1, TYPE_UNKNOWN = 2, TYPE_CONTROL = 3, TYPE_USER = 4, TYPE_UNUSED = 5,
       TYPE_BYTE = 6 };

/* llama.cpp's names for the gpt2-style pre-tokenizers, with the split regex
 * each stands for (as the models' tokenizer.json files write it), whether
 * the text is NFC-normalized first, and whether a word found whole in the
 * vocabulary skips the merges (Llama 3's ignore_merges). */
static const struct {
    const char *name, *regex;
    bool nfc, ignore_merges;
} pre_tokenizers[] = {
    {"qwen2",
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
     "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     true, false},
    {"llama-bpe",
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
     "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     false, true},
    /* GPT-2's own split, which ByteLevel's use_regex applies */
    {"default", NULL, false, false},
    {"gpt-2", NULL, false, false},
};
#define N_PRE (sizeof pre_tokenizers / sizeof pre_tokenizers[0])

const char *tok_gguf_pre_name(const char *regex)
{
    for (size_t i = 0; i < N_PRE; i++)
        if (regex && pre_tokenizers[i].regex && !strcmp(regex, pre_tokenizers[i].regex))
            return pre_tokenizers[i].name;
    return regex ? NULL : "default";
}

static struct json_object *str_len(const char *s, size_t len)
{
    return json_object_new_string_len(s, (int)len);
}

static void set(struct json_object *o, const char *key, struct json_object *v)
{
    json_object_object_add(o, key, v);
}

static struct json_object *byte_level(bool add_prefix_space, bool trim_offsets, bool use_regex)
{
    struct json_object *o = json_object_new_object();
    set(o, "type", json_object_new_string("ByteLevel"));
    set(o, "add_prefix_space", json_object_new_boolean(add_prefix_space));
    set(o, "trim_offsets", json_object_new_boolean(trim_offsets));
    set(o, "use_regex", json_object_new_boolean(use_regex));
    return o;
}

static struct json_object *typed(const char *type)
{
    struct json_object *o = json_object_new_object();
    set(o, "type", json_object_new_string(type));
    return o;
}

static struct json_object *sequence(const char *key, struct json_object *a, struct json_object *b,
                                    struct json_object *c, struct json_object *d)
{
    struct json_object *o = typed("Sequence"), *list = json_object_new_array();
    struct json_object *items[] = {a, b, c, d};
    for (int i = 0; i < 4; i++)
        if (items[i])
            json_object_array_add(list, items[i]);
    set(o, key, list);
    return o;
}

/* Replace normalizer/decoder: pattern String → content. */
static struct json_object *replace(const char *from, const char *to)
{
    struct json_object *o = typed("Replace"), *pat = json_object_new_object();
    set(pat, "String", json_object_new_string(from));
    set(o, "pattern", pat);
    set(o, "content", json_object_new_string(to));
    return o;
}

/* TemplateProcessing that puts BOS before a single sequence. */
static struct json_object *bos_template(const char *bos, int bos_id)
{
    struct json_object *o = typed("TemplateProcessing");
    struct json_object *single = json_object_new_array(), *pair = json_object_new_array();
    for (int seq = 0; seq < 2; seq++) {
        struct json_object *list = seq ? pair : single;
        for (int k = 0; k < (seq ? 2 : 1); k++) {
            struct json_object *sp = json_object_new_object(), *e = json_object_new_object();
            set(sp, "id", json_object_new_string(bos));
            set(sp, "type_id", json_object_new_int(0));
            set(e, "SpecialToken", sp);
            json_object_array_add(list, e);
            struct json_object *sq = json_object_new_object(), *e2 = json_object_new_object();
            set(sq, "id", json_object_new_string(k ? "B" : "A"));
            set(sq, "type_id", json_object_new_int(k));
            set(e2, "Sequence", sq);
            json_object_array_add(list, e2);
        }
    }
    set(o, "single", single);
    set(o, "pair", pair);
    struct json_object *specials = json_object_new_object(), *entry = json_object_new_object(),
                       *ids = json_object_new_array(), *toks = json_object_new_array();
    json_object_array_add(ids, json_object_new_int(bos_id));
    json_object_array_add(toks, json_object_new_string(bos));
    set(entry, "id", json_object_new_string(bos));
    set(entry, "ids", ids);
    set(entry, "tokens", toks);
    set(specials, bos, entry);
    set(o, "special_tokens", specials);
    return o;
}

/* SentencePiece BPE as merges, the way Hugging Face converts it: every
 * split of a piece into two pieces is a merge, ranked by the merged piece's
 * score (higher first), then by the halves' ids. */
struct merge {
    int left, right;
    float score;
    int merged;
};

static int cmp_merge(const void *a, const void *b)
{
    const struct merge *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    if (x->merged != y->merged)
        return x->merged < y->merged ? -1 : 1;
    if (x->left != y->left)
        return x->left < y->left ? -1 : 1;
    return (x->right > y->right) - (x->right < y->right);
}

static int spm_merges(const struct tok_gguf_vocab *v, struct json_object *vocab,
                      struct json_object *merges, struct err *err)
{
    size_t cap = 1024, n = 0;
    struct merge *all = malloc(cap * sizeof *all);
    if (!all)
        return err_set(err, INFERD_ENOMEM, "out of memory building merges");
    for (int i = 0; i < v->n_tokens; i++) {
        int type = v->types ? v->types[i] : TYPE_NORMAL;
        if (type != TYPE_NORMAL && type != TYPE_USER)
            continue;
        const struct tok_piece *p = &v->tokens[i];
        for (size_t cut = 1; cut < p->len; cut++) {
            if ((p->s[cut] & 0xc0) == 0x80)
                continue; /* not a character boundary */
            struct json_object *l, *r;
            char *ls = strndup(p->s, cut), *rs = strndup(p->s + cut, p->len - cut);
            bool hit = ls && rs && json_object_object_get_ex(vocab, ls, &l) &&
                       json_object_object_get_ex(vocab, rs, &r);
            free(ls);
            free(rs);
            if (!hit)
                continue;
            if (n == cap) {
                struct merge *grown = realloc(all, 2 * cap * sizeof *all);
                if (!grown) {
                    free(all);
                    return err_set(err, INFERD_ENOMEM, "out of memory building merges");
                }
                all = grown;
                cap *= 2;
            }
            all[n++] = (struct merge){json_object_get_int(l), json_object_get_int(r),
                                      v->scores ? v->scores[i] : 0.0f, i};
        }
    }
    qsort(all, n, sizeof *all, cmp_merge);
    for (size_t k = 0; k < n; k++) {
        const struct tok_piece *l = &v->tokens[all[k].left], *r = &v->tokens[all[k].right];
        struct json_object *pair = json_object_new_array();
        json_object_array_add(pair, str_len(l->s, l->len));
        json_object_array_add(pair, str_len(r->s, r->len));
        json_object_array_add(merges, pair);
    }
    free(all);
    return 0;
}

/* Pre-tokenizer, normalizer and decoder of a gpt2-style vocabulary. */
static int gpt2_parts(const struct tok_gguf_vocab *v, struct json_object *root,
                      struct json_object *model, struct err *err)
{
    char pre[64] = "default";
    if (v->pre) {
        if (v->pre_len >= sizeof pre)
            return err_set(err, INFERD_EUNSUPPORTED, "tokenizer.ggml.pre is too long");
        memcpy(pre, v->pre, v->pre_len);
        pre[v->pre_len] = '\0';
    }
    size_t k = 0;
    while (k < N_PRE && strcmp(pre_tokenizers[k].name, pre))
        k++;
    if (k == N_PRE)
        return err_set(err, INFERD_EUNSUPPORTED,
                       "tokenizer.ggml.pre '%s' is not supported (qwen2, llama-bpe, default)", pre);
    if (pre_tokenizers[k].regex) {
        struct json_object *split = typed("Split"), *pat = json_object_new_object();
        set(pat, "Regex", json_object_new_string(pre_tokenizers[k].regex));
        set(split, "pattern", pat);
        set(split, "behavior", json_object_new_string("Isolated"));
        set(split, "invert", json_object_new_boolean(false));
        set(root, "pre_tokenizer",
            sequence("pretokenizers", split, byte_level(false, false, false), NULL, NULL));
    } else {
        set(root, "pre_tokenizer", byte_level(false, true, true));
    }
    set(root, "normalizer", pre_tokenizers[k].nfc ? typed("NFC") : NULL);
    set(root, "decoder", byte_level(false, false, false));
    set(model, "ignore_merges", json_object_new_boolean(pre_tokenizers[k].ignore_merges));
    set(model, "byte_fallback", json_object_new_boolean(false));
    return 0;
}

/* Normalizer and decoder of a SentencePiece vocabulary, as HF's LlamaConverter writes them. */
static void spm_parts(const struct tok_gguf_vocab *v, struct json_object *root,
                      struct json_object *model)
{
    set(root, "normalizer",
        v->add_space_prefix ? sequence("normalizers", NULL, NULL, NULL, NULL) : NULL);
    if (v->add_space_prefix) {
        struct json_object *norm = json_object_object_get(root, "normalizer");
        struct json_object *list = json_object_object_get(norm, "normalizers");
        struct json_object *prepend = typed("Prepend");
        set(prepend, "prepend", json_object_new_string("\xe2\x96\x81"));
        json_object_array_add(list, prepend);
        json_object_array_add(list, replace(" ", "\xe2\x96\x81"));
    } else {
        set(root, "normalizer", replace(" ", "\xe2\x96\x81"));
    }
    set(root, "pre_tokenizer", NULL);
    struct json_object *strip = typed("Strip");
    set(strip, "content", json_object_new_string(" "));
    set(strip, "start", json_object_new_int(v->add_space_prefix ? 1 : 0));
    set(strip, "stop", json_object_new_int(0));
    set(root, "decoder", sequence("decoders", replace("\xe2\x96\x81", " "), typed("ByteFallback"),
                                  typed("Fuse"), strip));
    set(model, "byte_fallback", json_object_new_boolean(true));
    set(model, "fuse_unk", json_object_new_boolean(true));
    set(model, "ignore_merges", json_object_new_boolean(false));
}

static const char *piece_name(const struct tok_gguf_vocab *v, int id, char *buf, size_t cap)
{
    if (id < 0 || id >= v->n_tokens)
        return NULL;
    size_t n = v->tokens[id].len < cap - 1 ? v->tokens[id].len : cap - 1;
    memcpy(buf, v->tokens[id].s, n);
    buf[n] = '\0';
    return buf;
}

int tok_load_gguf_vocab(const struct tok_gguf_vocab *v, struct tokenizer **out, struct err *err)
{
    *out = NULL;
    bool spm;
    if (v->model && v->model_len == 4 && !memcmp(v->model, "gpt2", 4))
        spm = false;
    else if (v->model && v->model_len == 5 && !memcmp(v->model, "llama", 5))
        spm = true;
    else
        return err_set(err, INFERD_EUNSUPPORTED,
                       "tokenizer.ggml.model '%.*s' is not supported (gpt2, llama)",
                       v->model ? (int)(v->model_len < 40 ? v->model_len : 40) : 4,
                       v->model ? v->model : "none");
    if (spm && !v->scores)
        return err_set(err, INFERD_EFORMAT, "a llama (SentencePiece) vocabulary needs "
                                            "tokenizer.ggml.scores");
    if (!spm && !v->merges)
        return err_set(err, INFERD_EFORMAT, "a gpt2 vocabulary needs tokenizer.ggml.merges");
    struct json_object *root = json_object_new_object(), *model = typed("BPE");
    struct json_object *vocab = json_object_new_object(), *added = json_object_new_array(),
                       *merges = json_object_new_array();
    int rc = 0;
    for (int i = 0; i < v->n_tokens; i++) {
        const struct tok_piece *p = &v->tokens[i];
        int type = v->types ? v->types[i] : TYPE_NORMAL;
        if (type == TYPE_UNUSED)
            continue;
        char *key = strndup(p->s, p->len);
        if (!key) {
            rc = err_set(err, INFERD_ENOMEM, "out of memory building the vocabulary");
            goto out;
        }
        /* Control and user-defined tokens are matched in the text before the
         * model runs, as tokenizer.json's added tokens are; SentencePiece's
         * also stay in its vocabulary, where HF's converter keeps them. */
        if (type == TYPE_CONTROL || type == TYPE_USER || (spm && type == TYPE_UNKNOWN)) {
            struct json_object *a = json_object_new_object();
            set(a, "id", json_object_new_int(i));
            set(a, "content", str_len(p->s, p->len));
            set(a, "single_word", json_object_new_boolean(false));
            set(a, "lstrip", json_object_new_boolean(false));
            set(a, "rstrip", json_object_new_boolean(false));
            set(a, "normalized", json_object_new_boolean(type == TYPE_USER && !spm));
            set(a, "special", json_object_new_boolean(type != TYPE_USER));
            json_object_array_add(added, a);
        }
        if (!json_object_object_get_ex(vocab, key, NULL) &&
            (spm || (type != TYPE_CONTROL && type != TYPE_USER)))
            set(vocab, key, json_object_new_int(i));
        free(key);
    }
    for (int i = 0; !spm && i < v->n_merges; i++) {
        const struct tok_piece *m = &v->merges[i];
        const char *sp = memchr(m->s, ' ', m->len);
        if (!sp || sp == m->s || sp == m->s + m->len - 1) {
            rc = err_set(err, INFERD_EFORMAT, "tokenizer.ggml.merges[%d] is not 'left right'", i);
            goto out;
        }
        struct json_object *pair = json_object_new_array();
        json_object_array_add(pair, str_len(m->s, (size_t)(sp - m->s)));
        json_object_array_add(pair, str_len(sp + 1, m->len - (size_t)(sp - m->s) - 1));
        json_object_array_add(merges, pair);
    }
    if (spm && (rc = spm_merges(v, vocab, merges, err)))
        goto out;
    set(root, "version", json_object_new_string("1.0"));
    set(root, "added_tokens", added);
    added = NULL;
    char bos[256], eos[256], unk[256], pad[256];
    const char *bos_s = piece_name(v, v->bos_id, bos, sizeof bos);
    const char *eos_s = piece_name(v, v->eos_id, eos, sizeof eos);
    const char *unk_s = piece_name(v, v->unk_id, unk, sizeof unk);
    const char *pad_s = piece_name(v, v->pad_id, pad, sizeof pad);
    if (spm)
        spm_parts(v, root, model);
    else if ((rc = gpt2_parts(v, root, model, err)))
        goto out;
    bool add_bos = v->add_bos > 0 || (v->add_bos < 0 && spm);
    set(root, "post_processor",
        add_bos && bos_s ? bos_template(bos_s, v->bos_id) : byte_level(false, false, false));
    set(model, "dropout", NULL);
    set(model, "unk_token", spm && unk_s ? json_object_new_string(unk_s) : NULL);
    set(model, "vocab", vocab);
    set(model, "merges", merges);
    vocab = merges = NULL;
    set(root, "model", model);
    model = NULL;

    struct json_object *cfg = json_object_new_object();
    if (bos_s)
        set(cfg, "bos_token", json_object_new_string(bos_s));
    if (eos_s)
        set(cfg, "eos_token", json_object_new_string(eos_s));
    if (pad_s)
        set(cfg, "pad_token", json_object_new_string(pad_s));
    if (unk_s)
        set(cfg, "unk_token", json_object_new_string(unk_s));
    if (v->chat_template)
        set(cfg, "chat_template", str_len(v->chat_template, v->chat_template_len));
    set(cfg, "add_bos_token", json_object_new_boolean(add_bos));
    size_t tlen, clen;
    const char *text =
        json_object_to_json_string_length(root, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &tlen);
    const char *ctext =
        json_object_to_json_string_length(cfg, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &clen);
    rc = text && ctext ? tok_load_json(text, tlen, ctext, clen, out, err)
                       : err_set(err, INFERD_ENOMEM, "out of memory writing the tokenizer");
    json_object_put(cfg);
out:
    json_object_put(root);
    json_object_put(model);
    json_object_put(vocab);
    json_object_put(added);
    json_object_put(merges);
    if (rc)
        err_wrap(err, "tokenizer from GGUF metadata");
    return rc;
}
