/* text/bpe.c — the BPE model of tokenizer.json: vocab and merge ranks in hash maps, heap-driven merging, byte fallback and unk handling. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"
#include "base/hash.h"

struct vocab_entry {
    char *s; /* owned */
    uint32_t len;
    int32_t id;
};

struct merge_slot {
    uint64_t key; /* (left id << 32) | right id; UINT64_MAX when empty */
    int32_t rank, new_id;
};

/* Words already encoded, so common words skip the merge loop (as HF's BPE cache does).
 * Shared by all callers of one tokenizer, hence the lock; cleared when full. */
#define WORD_CACHE_SLOTS (1u << 14)
#define WORD_CACHE_MAX_WORD 64
struct word_cache_slot {
    uint64_t hash;
    char *word;   /* owned; NULL when empty */
    uint32_t len;
    uint32_t n_ids;
    int32_t *ids; /* owned */
};
struct word_cache {
    pthread_mutex_t lock;
    struct word_cache_slot *slots; /* owned; WORD_CACHE_SLOTS */
    size_t used;
};

struct bpe {
    struct word_cache *cache; /* owned; NULL when it could not be allocated */
    struct vocab_entry *entries; /* owned; n_entries */
    size_t n_entries;
    uint32_t *slots; /* owned; entry index + 1, 0 when empty; slot_mask + 1 of them */
    size_t slot_mask;
    const char **id_to_piece; /* owned array (strings borrowed from entries); max_id + 1 */
    int32_t max_id;
    struct merge_slot *merges; /* owned; merge_mask + 1 of them */
    size_t merge_mask;
    int32_t unk_id; /* -1 when none */
    char *prefix;   /* owned; continuing_subword_prefix, may be NULL */
    size_t prefix_len;
    char *suffix;   /* owned; end_of_word_suffix, may be NULL */
    size_t suffix_len;
    bool fuse_unk, byte_fallback, ignore_merges;
    int32_t byte_ids[256]; /* <0xNN> tokens, -1 when absent */
};

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = hash_fnv1a(HASH_FNV_OFFSET, s, n);
    return h ^ (h >> 29);
}

int32_t bpe_piece_to_id(const struct bpe *m, const char *s, size_t len)
{
    size_t i = hash_bytes(s, len) & m->slot_mask;
    for (;;) {
        uint32_t e = m->slots[i];
        if (!e)
            return -1;
        const struct vocab_entry *v = &m->entries[e - 1];
        if (v->len == len && !memcmp(v->s, s, len))
            return v->id;
        i = (i + 1) & m->slot_mask;
    }
}

const char *bpe_id_to_piece(const struct bpe *m, int32_t id)
{
    if (id < 0 || id > m->max_id)
        return NULL;
    return m->id_to_piece[id];
}

int32_t bpe_max_id(const struct bpe *m) { return m->max_id; }

static const struct merge_slot *merge_find(const struct bpe *m, int32_t a, int32_t b)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = hash_mix64(key) & m->merge_mask;
    for (;;) {
        const struct merge_slot *s = &m->merges[i];
        if (s->key == key)
            return s;
        if (s->key == UINT64_MAX)
            return NULL;
        i = (i + 1) & m->merge_mask;
    }
}

static void cache_clear(struct word_cache *c)
{
    for (size_t i = 0; c->used && i < WORD_CACHE_SLOTS; i++) {
        free(c->slots[i].word);
        free(c->slots[i].ids);
        c->slots[i].word = NULL;
        c->slots[i].ids = NULL;
    }
    c->used = 0;
}

void bpe_free(struct bpe *m)
{
    if (!m)
        return;
    if (m->cache) {
        if (m->cache->slots)
            cache_clear(m->cache);
        free(m->cache->slots);
        pthread_mutex_destroy(&m->cache->lock);
        free(m->cache);
    }
    for (size_t i = 0; i < m->n_entries; i++)
        free(m->entries[i].s);
    free(m->entries);
    free(m->slots);
    free(m->id_to_piece);
    free(m->merges);
    free(m->prefix);
    free(m->suffix);
    free(m);
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c *= 2;
    return c;
}

static int parse_vocab(struct bpe *m, const struct json_reader *vocab, struct err *err)
{
    size_t n = (size_t)json_object_object_length(vocab->v);
    m->entries = calloc(n ? n : 1, sizeof *m->entries);
    m->slot_mask = pow2_at_least(n * 2 + 1) - 1;
    m->slots = calloc(m->slot_mask + 1, sizeof *m->slots);
    if (!m->entries || !m->slots)
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory for the vocab");
    m->max_id = -1;
    json_object_object_foreach(vocab->v, key, val)
    {
        struct json_reader entry = json_reader_entry(vocab, key, val);
        int64_t id = 0;
        int rc = tok_json_index(&entry, NULL, JSON_REQUIRED, (1 << 26) - 1, &id);
        if (rc)
            return rc;
        size_t len = strlen(key);
        if (bpe_piece_to_id(m, key, len) >= 0)
            continue;
        struct vocab_entry *e = &m->entries[m->n_entries];
        if (!(e->s = malloc(len + 1)))
            return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory for the vocab");
        memcpy(e->s, key, len + 1);
        e->len = (uint32_t)len;
        e->id = (int32_t)id;
        m->n_entries++;
        size_t i = hash_bytes(key, len) & m->slot_mask;
        while (m->slots[i])
            i = (i + 1) & m->slot_mask;
        m->slots[i] = (uint32_t)m->n_entries;
        if (e->id > m->max_id)
            m->max_id = e->id;
    }
    m->id_to_piece = calloc((size_t)m->max_id + 2, sizeof *m->id_to_piece);
    if (!m->id_to_piece)
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory for the vocab");
    for (size_t i = 0; i < m->n_entries; i++)
        if (!m->id_to_piece[m->entries[i].id])
            m->id_to_piece[m->entries[i].id] = m->entries[i].s;
    return 0;
}

static int add_merge(struct bpe *m, size_t rank, const char *a, size_t alen, const char *b,
                     size_t blen, struct err *err)
{
    int32_t ia = bpe_piece_to_id(m, a, alen), ib = bpe_piece_to_id(m, b, blen);
    if (ia < 0 || ib < 0)
        return err_set(err, INFERD_EFORMAT, "tokenizer: merge %zu uses a token not in the vocab",
                       rank + 1);
    if (m->prefix_len && blen >= m->prefix_len && !memcmp(b, m->prefix, m->prefix_len)) {
        b += m->prefix_len;
        blen -= m->prefix_len;
    }
    char stack[256];
    char *joined = alen + blen <= sizeof stack ? stack : malloc(alen + blen);
    if (!joined)
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory for merges");
    memcpy(joined, a, alen);
    memcpy(joined + alen, b, blen);
    int32_t nid = bpe_piece_to_id(m, joined, alen + blen);
    if (joined != stack)
        free(joined);
    if (nid < 0)
        return err_set(err, INFERD_EFORMAT,
                       "tokenizer: merge %zu makes a token that is not in the vocab", rank + 1);
    uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
    size_t i = hash_mix64(key) & m->merge_mask;
    while (m->merges[i].key != UINT64_MAX && m->merges[i].key != key)
        i = (i + 1) & m->merge_mask;
    m->merges[i] = (struct merge_slot){key, (int32_t)rank, nid};
    return 0;
}

static int parse_merges(struct bpe *m, const struct json_reader *merges, size_t n,
                        struct err *err)
{
    m->merge_mask = pow2_at_least(n * 2 + 1) - 1;
    m->merges = malloc((m->merge_mask + 1) * sizeof *m->merges);
    if (!m->merges)
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory for merges");
    memset(m->merges, 0xff, (m->merge_mask + 1) * sizeof *m->merges);
    for (size_t r = 0; r < n; r++) {
        json_object *e = json_object_array_get_idx(merges->v, r);
        int rc;
        if (json_object_is_type(e, json_type_string)) {
            const char *s = json_object_get_string(e);
            size_t len = (size_t)json_object_get_string_len(e);
            const char *sp = memchr(s, ' ', len);
            if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - s)))
                return err_set(err, INFERD_EFORMAT,
                               "tokenizer: merge %zu is not two tokens separated by one space",
                               r + 1);
            rc = add_merge(m, r, s, (size_t)(sp - s), sp + 1, len - (size_t)(sp + 1 - s), err);
        } else if (json_object_is_type(e, json_type_array) && json_object_array_length(e) == 2 &&
                   json_object_is_type(json_object_array_get_idx(e, 0), json_type_string) &&
                   json_object_is_type(json_object_array_get_idx(e, 1), json_type_string)) {
            json_object *a = json_object_array_get_idx(e, 0), *b = json_object_array_get_idx(e, 1);
            rc = add_merge(m, r, json_object_get_string(a), (size_t)json_object_get_string_len(a),
                           json_object_get_string(b), (size_t)json_object_get_string_len(b), err);
        } else {
            return err_set(err, INFERD_EFORMAT,
                           "tokenizer: merge %zu must be \"a b\" or [\"a\", \"b\"]", r + 1);
        }
        if (rc)
            return rc;
    }
    return 0;
}

int bpe_parse(const struct json_reader *model, struct bpe **out, struct err *err)
{
    *out = NULL;
    struct bpe *m = calloc(1, sizeof *m);
    if (!m)
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
    struct json_reader vocab, merges;
    size_t n_merges = 0;
    const char *unk = NULL;
    size_t unk_len = 0;
    int rc;
    if ((rc = json_read_object(model, "vocab", JSON_REQUIRED, &vocab)) ||
        (rc = json_read_array(model, "merges", JSON_OPTIONAL, &merges, &n_merges)) ||
        (rc = json_read_strdup(model, "continuing_subword_prefix", JSON_OPTIONAL, &m->prefix,
                               &m->prefix_len)) ||
        (rc = json_read_strdup(model, "end_of_word_suffix", JSON_OPTIONAL, &m->suffix,
                               &m->suffix_len)) ||
        (rc = json_read_bool(model, "fuse_unk", JSON_OPTIONAL, &m->fuse_unk)) ||
        (rc = json_read_bool(model, "byte_fallback", JSON_OPTIONAL, &m->byte_fallback)) ||
        (rc = json_read_bool(model, "ignore_merges", JSON_OPTIONAL, &m->ignore_merges)) ||
        (rc = parse_vocab(m, &vocab, err)) || (rc = parse_merges(m, &merges, n_merges, err)) ||
        (rc = json_read_str(model, "unk_token", JSON_OPTIONAL, &unk, &unk_len))) {
        bpe_free(m);
        return rc;
    }
    m->unk_id = unk ? bpe_piece_to_id(m, unk, unk_len) : -1;
    m->cache = calloc(1, sizeof *m->cache);
    if (m->cache && pthread_mutex_init(&m->cache->lock, NULL) != 0) {
        free(m->cache);
        m->cache = NULL;
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        m->byte_ids[b] = bpe_piece_to_id(m, name, 6);
    }
    *out = m;
    return 0;
}

/* ------------------------------------------------------------------ merging */

struct symbol {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    bool alive;
};

struct heap_item {
    int32_t rank, pos, new_id;
    int32_t left, right; /* the pair's ids when pushed: if either changed, the item is stale */
};

static bool heap_less(struct heap_item a, struct heap_item b)
{
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

struct heap {
    struct heap_item *v; /* owned */
    size_t n, cap;
};

static int heap_push(struct heap *h, struct heap_item it, struct err *err)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        struct heap_item *v = realloc(h->v, cap * sizeof *v);
        if (!v)
            return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i && heap_less(it, h->v[(i - 1) / 2])) {
        h->v[i] = h->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->v[i] = it;
    return 0;
}

static struct heap_item heap_pop(struct heap *h)
{
    struct heap_item top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && heap_less(h->v[c + 1], h->v[c]))
            c++;
        if (!heap_less(h->v[c], last))
            break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n)
        h->v[i] = last;
    return top;
}

struct symbols {
    struct symbol *v; /* owned */
    size_t n, cap;
};

static int sym_push(struct symbols *s, int32_t id, struct err *err)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 32;
        struct symbol *v = realloc(s->v, cap * sizeof *v);
        if (!v)
            return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n] = (struct symbol){id, (int32_t)s->n - 1, -1, true};
    if (s->n)
        s->v[s->n - 1].next = (int32_t)s->n;
    s->n++;
    return 0;
}

static int initial_symbols(const struct bpe *m, const char *s, size_t len, struct symbols *sy,
                           struct err *err)
{
    char stack[128];
    bool last_unk = false;
    for (size_t i = 0; i < len;) {
        size_t at = i;
        tok_utf8_next(s, len, &i);
        size_t clen = i - at;
        bool first = at == 0, last = i == len;
        size_t need = clen + (first ? 0 : m->prefix_len) + (last ? m->suffix_len : 0);
        int32_t id;
        if (need == clen) {
            id = bpe_piece_to_id(m, s + at, clen);
        } else {
            char *buf = need <= sizeof stack ? stack : malloc(need);
            if (!buf)
                return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
            size_t o = 0;
            if (!first && m->prefix_len) {
                memcpy(buf, m->prefix, m->prefix_len);
                o = m->prefix_len;
            }
            memcpy(buf + o, s + at, clen);
            o += clen;
            if (last && m->suffix_len) {
                memcpy(buf + o, m->suffix, m->suffix_len);
                o += m->suffix_len;
            }
            id = bpe_piece_to_id(m, buf, o);
            if (buf != stack)
                free(buf);
        }
        int rc = 0;
        if (id >= 0) {
            rc = sym_push(sy, id, err);
            last_unk = false;
        } else {
            bool bytes_ok = m->byte_fallback;
            for (size_t k = at; bytes_ok && k < i; k++)
                bytes_ok = m->byte_ids[(uint8_t)s[k]] >= 0;
            if (bytes_ok) {
                for (size_t k = at; !rc && k < i; k++)
                    rc = sym_push(sy, m->byte_ids[(uint8_t)s[k]], err);
                last_unk = false;
            } else if (m->unk_id >= 0) {
                if (!(m->fuse_unk && last_unk))
                    rc = sym_push(sy, m->unk_id, err);
                last_unk = true;
            }
        }
        if (rc)
            return rc;
    }
    return 0;
}

static int push_pair(const struct bpe *m, struct symbols *sy, struct heap *h, int32_t pos,
                     struct err *err)
{
    int32_t nx = sy->v[pos].next;
    if (pos < 0 || nx < 0)
        return 0;
    const struct merge_slot *ms = merge_find(m, sy->v[pos].id, sy->v[nx].id);
    if (!ms)
        return 0;
    return heap_push(h, (struct heap_item){ms->rank, pos, ms->new_id, sy->v[pos].id, sy->v[nx].id},
                     err);
}

/* Appends the cached ids of s to out; returns 1 on a hit, 0 on a miss, <0 on error. */
static int cache_get(struct word_cache *c, uint64_t h, const char *s, size_t len,
                     struct idlist *out, struct err *err)
{
    int rc = 0;
    pthread_mutex_lock(&c->lock);
    for (size_t i = h & (WORD_CACHE_SLOTS - 1); c->slots; i = (i + 1) & (WORD_CACHE_SLOTS - 1)) {
        struct word_cache_slot *sl = &c->slots[i];
        if (!sl->word)
            break;
        if (sl->hash == h && sl->len == len && !memcmp(sl->word, s, len)) {
            for (uint32_t k = 0; rc == 0 && k < sl->n_ids; k++)
                rc = idlist_push(out, sl->ids[k], err);
            if (rc == 0)
                rc = 1;
            break;
        }
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

static void cache_put(struct word_cache *c, uint64_t h, const char *s, size_t len,
                      const int32_t *ids, size_t n)
{
    char *w = malloc(len);
    int32_t *v = malloc(n * sizeof *v + 1);
    if (!w || !v) {
        free(w);
        free(v);
        return;
    }
    memcpy(w, s, len);
    if (n)
        memcpy(v, ids, n * sizeof *v);
    pthread_mutex_lock(&c->lock);
    /* The slots are allocated on first use: small tokenizers that never encode stay small. */
    if (!c->slots && !(c->slots = calloc(WORD_CACHE_SLOTS, sizeof *c->slots))) {
        pthread_mutex_unlock(&c->lock);
        free(w);
        free(v);
        return;
    }
    if (c->used * 4 >= WORD_CACHE_SLOTS * 3)
        cache_clear(c);
    size_t i = h & (WORD_CACHE_SLOTS - 1);
    while (c->slots[i].word) {
        if (c->slots[i].hash == h && c->slots[i].len == len && !memcmp(c->slots[i].word, s, len))
            break;
        i = (i + 1) & (WORD_CACHE_SLOTS - 1);
    }
    if (c->slots[i].word) {
        free(w);
        free(v);
    } else {
        c->slots[i] = (struct word_cache_slot){h, w, (uint32_t)len, (uint32_t)n, v};
        c->used++;
    }
    pthread_mutex_unlock(&c->lock);
}

static int encode_word_uncached(const struct bpe *m, const char *s, size_t len,
                                struct idlist *out, struct err *err);

int bpe_encode_word(const struct bpe *m, const char *s, size_t len, struct idlist *out,
                    struct err *err)
{
    if (len == 0)
        return 0;
    if (!m->cache || len > WORD_CACHE_MAX_WORD)
        return encode_word_uncached(m, s, len, out, err);
    uint64_t h = hash_bytes(s, len);
    int rc = cache_get(m->cache, h, s, len, out, err);
    if (rc)
        return rc < 0 ? rc : 0;
    size_t start = out->n;
    rc = encode_word_uncached(m, s, len, out, err);
    if (rc == 0)
        cache_put(m->cache, h, s, len, out->n > start ? out->v + start : NULL, out->n - start);
    return rc;
}

static int encode_word_uncached(const struct bpe *m, const char *s, size_t len,
                                struct idlist *out, struct err *err)
{
    if (m->ignore_merges) {
        int32_t id = bpe_piece_to_id(m, s, len);
        if (id >= 0)
            return idlist_push(out, id, err);
    }
    struct symbols sy = {0};
    struct heap h = {0};
    int rc = initial_symbols(m, s, len, &sy, err);
    for (size_t i = 0; !rc && i + 1 < sy.n; i++)
        rc = push_pair(m, &sy, &h, (int32_t)i, err);
    while (!rc && h.n) {
        struct heap_item it = heap_pop(&h);
        struct symbol *a = &sy.v[it.pos];
        if (!a->alive || a->next < 0)
            continue;
        struct symbol *b = &sy.v[a->next];
        if (a->id != it.left || b->id != it.right)
            continue;
        a->id = it.new_id;
        b->alive = false;
        a->next = b->next;
        if (b->next >= 0)
            sy.v[b->next].prev = it.pos;
        if (a->prev >= 0)
            rc = push_pair(m, &sy, &h, a->prev, err);
        if (!rc)
            rc = push_pair(m, &sy, &h, it.pos, err);
    }
    for (int32_t i = sy.n ? 0 : -1; !rc && i >= 0; i = sy.v[i].next)
        rc = idlist_push(out, sy.v[i].id, err);
    free(sy.v);
    free(h.v);
    return rc;
}
