/* text/added_tokens.c — added tokens: a byte trie matched leftmost-longest over text, with lstrip/rstrip/single_word. */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"
#include "base/hash.h"

struct edge {
    uint64_t key; /* (node << 8) | byte, UINT64_MAX when empty */
    int32_t child;
};

struct added_matcher {
    int32_t root_child[256]; /* child of the root per first byte, -1 when none */
    struct idlist terminal; /* owned; per node: index of the token ending here, or -1 */
    struct edge *edges; /* owned; open addressing, edge_mask + 1 slots */
    size_t edge_mask, n_edges;
    char **contents; /* owned; per token index: the (normalized) text matched, or NULL */
    size_t *lens;    /* owned */
    size_t n_tokens;
};


static int32_t child_of(const struct added_matcher *m, int32_t node, uint8_t b)
{
    uint64_t key = ((uint64_t)node << 8) | b;
    size_t i = hash_mix64(key) & m->edge_mask;
    for (;;) {
        if (m->edges[i].key == key)
            return m->edges[i].child;
        if (m->edges[i].key == UINT64_MAX)
            return -1;
        i = (i + 1) & m->edge_mask;
    }
}

static int grow_edges(struct added_matcher *m, struct err *err)
{
    size_t cap = (m->edge_mask + 1) * 2;
    struct edge *e = malloc(cap * sizeof *e);
    if (!e)
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory for added tokens");
    memset(e, 0xff, cap * sizeof *e);
    for (size_t i = 0; i <= m->edge_mask; i++) {
        if (m->edges[i].key == UINT64_MAX)
            continue;
        size_t k = hash_mix64(m->edges[i].key) & (cap - 1);
        while (e[k].key != UINT64_MAX)
            k = (k + 1) & (cap - 1);
        e[k] = m->edges[i];
    }
    free(m->edges);
    m->edges = e;
    m->edge_mask = cap - 1;
    return 0;
}

static int new_node(struct added_matcher *m, int32_t *out, struct err *err)
{
    *out = (int32_t)m->terminal.n;
    return idlist_push(&m->terminal, -1, err);
}

static int insert(struct added_matcher *m, const char *s, size_t len, int32_t tok,
                  struct err *err)
{
    int32_t node = 0;
    for (size_t i = 0; i < len; i++) {
        int32_t c = child_of(m, node, (uint8_t)s[i]);
        if (c < 0) {
            int rc;
            if ((m->n_edges + 1) * 2 > m->edge_mask + 1 && (rc = grow_edges(m, err)))
                return rc;
            if ((rc = new_node(m, &c, err)))
                return rc;
            uint64_t key = ((uint64_t)node << 8) | (uint8_t)s[i];
            size_t k = hash_mix64(key) & m->edge_mask;
            while (m->edges[k].key != UINT64_MAX)
                k = (k + 1) & m->edge_mask;
            m->edges[k] = (struct edge){key, c};
            m->n_edges++;
        }
        node = c;
    }
    /* The first token with a given content wins, as in HF's map. */
    if (m->terminal.v[node] < 0)
        m->terminal.v[node] = tok;
    return 0;
}

void added_matcher_free(struct added_matcher *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n_tokens; i++)
        free(m->contents[i]);
    free(m->contents);
    free(m->lens);
    free(m->terminal.v);
    free(m->edges);
    free(m);
}

bool added_matcher_empty(const struct added_matcher *m) { return !m || m->n_edges == 0; }

int added_matcher_build(const struct added_token *toks, size_t n, bool want_normalized,
                        const struct normalizer *norm, struct added_matcher **out,
                        struct err *err)
{
    *out = NULL;
    struct added_matcher *m = calloc(1, sizeof *m);
    if (!m)
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory for added tokens");
    int32_t root;
    int rc = new_node(m, &root, err);
    m->edge_mask = 63;
    m->edges = malloc(64 * sizeof *m->edges);
    m->contents = calloc(n ? n : 1, sizeof *m->contents);
    m->lens = calloc(n ? n : 1, sizeof *m->lens);
    m->n_tokens = n;
    if (!rc && (!m->edges || !m->contents || !m->lens))
        rc = err_set(err, INFERD_ENOMEM, "tokenizer: out of memory for added tokens");
    if (!rc)
        memset(m->edges, 0xff, 64 * sizeof *m->edges);
    for (size_t i = 0; !rc && i < n; i++) {
        if (toks[i].normalized != want_normalized || toks[i].len == 0)
            continue;
        struct strbuf b = {0};
        rc = tok_put(&b, toks[i].content, toks[i].len, err);
        if (!rc && want_normalized && norm)
            rc = normalizer_apply(norm, &b, err);
        if (!rc && b.len)
            rc = insert(m, b.data, b.len, (int32_t)i, err);
        m->contents[i] = b.data;
        m->lens[i] = b.len;
    }
    for (int b = 0; !rc && b < 256; b++)
        m->root_child[b] = child_of(m, 0, (uint8_t)b);
    if (rc) {
        added_matcher_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

static bool is_word_char(uint32_t cp) { return cp == '_' || tok_is_alnum(cp); }

/* The code point that ends just before s[end]. */
static uint32_t cp_before(const char *s, size_t end, size_t *start)
{
    size_t i = end;
    while (i > 0 && ((uint8_t)s[i - 1] & 0xC0) == 0x80)
        i--;
    if (i > 0)
        i--;
    *start = i;
    size_t j = i;
    return tok_utf8_next(s, end, &j);
}

int added_matcher_split(const struct added_matcher *m, const struct added_token *toks,
                        const char *s, size_t len, struct spanlist *out, struct idlist *tok_idx,
                        struct err *err)
{
    out->n = 0;
    tok_idx->n = 0;
    size_t done = 0, pos = 0;
    int rc = 0;
    while (rc == 0 && pos < len) {
        /* Leftmost-longest: the first start position with any match, its longest match. */
        int32_t best = -1;
        size_t mstart = 0, mend = 0;
        for (size_t i = pos; i < len && best < 0; i++) {
            int32_t node = m->root_child[(uint8_t)s[i]];
            if (node < 0)
                continue;
            if (m->terminal.v[node] >= 0) {
                best = m->terminal.v[node];
                mstart = i;
                mend = i + 1;
            }
            for (size_t j = i + 1; j < len; j++) {
                node = child_of(m, node, (uint8_t)s[j]);
                if (node < 0)
                    break;
                if (m->terminal.v[node] >= 0) {
                    best = m->terminal.v[node];
                    mstart = i;
                    mend = j + 1;
                }
            }
        }
        if (best < 0)
            break;
        pos = mend;
        const struct added_token *t = &toks[best];
        size_t start = mstart, stop = mend;
        if (t->single_word) {
            size_t k;
            bool start_ok = start == 0 || !is_word_char(cp_before(s, start, &k));
            size_t q = stop;
            bool stop_ok = stop == len || !is_word_char(tok_utf8_next(s, len, &q));
            if (!start_ok || !stop_ok)
                continue;
        }
        if (t->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t k;
                if (!tok_is_whitespace(cp_before(s, ns, &k)))
                    break;
                ns = k;
            }
            start = ns > done ? ns : done;
        }
        if (t->rstrip) {
            size_t q = stop;
            while (q < len) {
                size_t at = q;
                if (!tok_is_whitespace(tok_utf8_next(s, len, &q))) {
                    q = at;
                    break;
                }
            }
            stop = q;
            pos = stop;
        }
        if (done < start && (rc = spanlist_push(out, done, start, false, err)))
            break;
        if ((rc = spanlist_push(out, start, stop, true, err)) || (rc = idlist_push(tok_idx, best, err)))
            break;
        done = stop;
    }
    if (rc == 0 && done < len)
        rc = spanlist_push(out, done, len, false, err);
    return rc;
}
