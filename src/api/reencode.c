/* api/reencode.c — the bounded, namespaced map from text the model generated to the ids it
 * generated, so resent replies keep their own tokens (the rule is in api/reencode.h). */
#include "api/reencode.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* A place where text[0..off) decodes from exactly ids[0..n): the end of a generation. */
struct cut {
    size_t off;
    int n;
};

/* One conversation branch. Entries form a list, most recently used first. */
struct entry {
    struct entry *prev, *next;
    uint64_t ns;
    bool add_special;
    char *text;        /* owned; len bytes */
    size_t len;
    int32_t *ids;      /* owned; n_ids */
    int n_ids;
    struct cut *cuts;  /* owned; n_cuts, ascending (off and n both grow) */
    int n_cuts;
    size_t bytes;      /* what this entry counts against the cap */
};

struct reencode {
    const struct tokenizer *tok; /* borrowed */
    size_t max_bytes;
    /* True when tok_encode with add_special only puts ids in front (e.g. BOS), so a remembered
     * completion prompt followed by an encoded remainder is what the tokenizer means; when it
     * appends too, completions are encoded plainly and not remembered. */
    bool special_is_prefix;
    pthread_mutex_t mu;          /* guards everything below */
    struct entry *head, *tail;
    size_t n_entries, bytes;
    uint64_t hits, misses, evictions;
};

static bool ids_end_with(const int32_t *a, int na, const int32_t *b, int nb)
{
    return na >= nb && !memcmp(a + (na - nb), b, (size_t)nb * sizeof *b);
}

int reencode_create(const struct tokenizer *tok, size_t max_bytes, struct reencode **out,
                    struct err *err)
{
    struct reencode *r = calloc(1, sizeof *r);
    if (!r)
        return err_set(err, INFERD_ENOMEM, "out of memory for the re-encoding map");
    if (pthread_mutex_init(&r->mu, NULL) != 0) {
        free(r);
        return err_set(err, INFERD_ENOMEM, "cannot create the re-encoding map's lock");
    }
    r->tok = tok;
    r->max_bytes = max_bytes;
    int32_t *with = NULL, *without = NULL;
    int n_with = 0, n_without = 0;
    struct err probe = {0};
    r->special_is_prefix = tok_encode(tok, "a", 1, true, &with, &n_with, &probe) == 0 &&
                           tok_encode(tok, "a", 1, false, &without, &n_without, &probe) == 0 &&
                           ids_end_with(with, n_with, without, n_without);
    free(with);
    free(without);
    *out = r;
    return 0;
}

static void entry_free(struct entry *e)
{
    if (!e)
        return;
    free(e->text);
    free(e->ids);
    free(e->cuts);
    free(e);
}

void reencode_free(struct reencode *r)
{
    if (!r)
        return;
    for (struct entry *e = r->head, *next; e; e = next) {
        next = e->next;
        entry_free(e);
    }
    pthread_mutex_destroy(&r->mu);
    free(r);
}

static void list_unlink(struct reencode *r, struct entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        r->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        r->tail = e->prev;
    e->prev = e->next = NULL;
    r->n_entries--;
    r->bytes -= e->bytes;
}

static void list_push_front(struct reencode *r, struct entry *e)
{
    e->prev = NULL;
    e->next = r->head;
    if (r->head)
        r->head->prev = e;
    else
        r->tail = e;
    r->head = e;
    r->n_entries++;
    r->bytes += e->bytes;
}

/* Bytes a and b share from the start. */
static size_t common_prefix(const char *a, size_t na, const char *b, size_t nb)
{
    size_t n = na < nb ? na : nb, i = 0;
    /* Whole chunks by memcmp first: shared system prompts run to many kilobytes. */
    while (i + 256 <= n && !memcmp(a + i, b + i, 256))
        i += 256;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

static bool usable(const struct reencode *r, bool add_special)
{
    return r->max_bytes > 0 && (!add_special || r->special_is_prefix);
}

int reencode_encode(struct reencode *r, uint64_t ns, bool add_special, const char *text,
                    size_t len, int32_t **ids, int *n_ids, int *n_reused, struct err *err)
{
    *ids = NULL;
    *n_ids = 0;
    if (n_reused)
        *n_reused = 0;
    if (!usable(r, add_special))
        return tok_encode(r->tok, text, len, add_special, ids, n_ids, err);

    /* The longest cut of the namespace whose text leads the new text; its ids are copied out
     * under the lock so the remainder is encoded without it. */
    int32_t *head = NULL;
    struct cut best = {0, 0};
    pthread_mutex_lock(&r->mu);
    struct entry *from = NULL;
    for (struct entry *e = r->head; e; e = e->next) {
        if (e->ns != ns || e->add_special != add_special ||
            e->cuts[e->n_cuts - 1].off <= best.off || e->cuts[0].off > len)
            continue; /* another namespace, or no cut that could beat the best or fit */
        size_t shared = common_prefix(e->text, e->len, text, len);
        for (int i = e->n_cuts - 1; i >= 0; i--) {
            if (e->cuts[i].off <= shared) {
                if (e->cuts[i].off > best.off) {
                    best = e->cuts[i];
                    from = e;
                }
                break;
            }
        }
    }
    if (from) {
        head = malloc((size_t)best.n * sizeof *head);
        if (head) {
            memcpy(head, from->ids, (size_t)best.n * sizeof *head);
            list_unlink(r, from);
            list_push_front(r, from);
            r->hits++;
        }
    } else {
        r->misses++;
    }
    pthread_mutex_unlock(&r->mu);
    if (from && !head)
        return err_set(err, INFERD_ENOMEM, "out of memory for %d remembered ids", best.n);
    if (!head)
        return tok_encode(r->tok, text, len, add_special, ids, n_ids, err);

    int32_t *rest = NULL;
    int n_rest = 0;
    int rc = tok_encode(r->tok, text + best.off, len - best.off, false, &rest, &n_rest, err);
    if (rc < 0) {
        free(head);
        return rc;
    }
    int32_t *all = realloc(head, ((size_t)best.n + (size_t)n_rest + 1) * sizeof *all);
    if (!all) {
        free(head);
        free(rest);
        return err_set(err, INFERD_ENOMEM, "out of memory for a prompt of %d ids",
                       best.n + n_rest);
    }
    if (n_rest > 0)
        memcpy(all + best.n, rest, (size_t)n_rest * sizeof *all);
    free(rest);
    *ids = all;
    *n_ids = best.n + n_rest;
    if (n_reused)
        *n_reused = best.n;
    return 0;
}

/* True when ids decode (special tokens skipped, as the engine's detokenizer emits them) to
 * exactly text. */
static bool decodes_to(const struct tokenizer *tok, const int32_t *ids, int n, const char *text,
                       size_t len)
{
    char *dec = NULL;
    size_t dec_len = 0;
    struct err err = {0};
    bool same = tok_decode(tok, ids, n, true, &dec, &dec_len, &err) == 0 && dec_len == len &&
                !memcmp(dec, text, len);
    free(dec);
    return same;
}

/* How many leading gen_ids decode to a prefix of gen_text that ends on their last token, and
 * that prefix's length: all of them in the usual case; after a stop string (the text was cut
 * while tokens ran on) the last token whose text lies wholly inside gen_text. */
static int consistent_prefix(const struct tokenizer *tok, const int32_t *ids, int n,
                             const char *text, size_t len, size_t *text_len)
{
    *text_len = 0;
    if (n == 0)
        return 0;
    if (decodes_to(tok, ids, n, text, len)) {
        *text_len = len;
        return n;
    }
    /* Stream the ids: after token i the detokenizer has emitted ends[i] bytes, all of which must
     * be gen_text's. A candidate is then confirmed by decoding its ids as a whole, since the
     * stream may hold back bytes (incomplete UTF-8) at a candidate's end. */
    size_t *ends = malloc((size_t)n * sizeof *ends);
    struct detok *d = NULL;
    struct err err = {0};
    int k = 0;
    if (!ends || detok_create(tok, true, &d, &err) < 0)
        goto out;
    size_t emitted = 0;
    int last = 0; /* tokens whose streamed text agrees with gen_text */
    for (int i = 0; i < n; i++) {
        const char *piece = "";
        size_t piece_len = 0;
        if (detok_push(d, ids[i], &piece, &piece_len, &err) < 0 || piece_len > len - emitted ||
            memcmp(piece, text + emitted, piece_len) != 0)
            break;
        emitted += piece_len;
        ends[i] = emitted;
        last = i + 1;
    }
    /* A few candidates from the end: each failure means bytes held back across that token, which
     * only spans a handful of tokens, so more tries would not find a boundary the stream hid. */
    for (int i = last, tries = 0; i > 0 && tries < 8; i--, tries++) {
        if (decodes_to(tok, ids, i, text, ends[i - 1])) {
            k = i;
            *text_len = ends[i - 1];
            break;
        }
    }
out:
    detok_free(d);
    free(ends);
    return k;
}

static int cut_cmp(const void *a, const void *b)
{
    const struct cut *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Whether e's last cut (and so every cut of e) is also a cut of the sequence (text, ids). */
static bool covered_by(const struct entry *e, const char *text, size_t len, const int32_t *ids,
                       int n_ids)
{
    const struct cut *c = &e->cuts[e->n_cuts - 1];
    return c->off <= len && c->n <= n_ids && !memcmp(e->text, text, c->off) &&
           !memcmp(e->ids, ids, (size_t)c->n * sizeof *ids);
}

static size_t entry_bytes(const struct entry *e)
{
    return sizeof *e + e->len + (size_t)e->n_ids * sizeof *e->ids +
           (size_t)e->n_cuts * sizeof *e->cuts;
}

int reencode_remember(struct reencode *r, uint64_t ns, bool add_special, const char *prompt_text,
                      size_t prompt_len, const int32_t *prompt_ids, int n_prompt,
                      const char *gen_text, size_t gen_len, const int32_t *gen_ids, int n_gen,
                      struct err *err)
{
    if (!usable(r, add_special) || n_gen <= 0)
        return 0;
    size_t keep_len = 0;
    int keep = consistent_prefix(r->tok, gen_ids, n_gen, gen_text, gen_len, &keep_len);
    if (keep == 0)
        return 0;

    struct entry *e = calloc(1, sizeof *e);
    if (!e)
        return err_set(err, INFERD_ENOMEM, "out of memory for a remembered generation");
    e->ns = ns;
    e->add_special = add_special;
    e->len = prompt_len + keep_len;
    e->n_ids = n_prompt + keep;
    e->text = malloc(e->len + 1);
    e->ids = malloc((size_t)e->n_ids * sizeof *e->ids);
    e->cuts = malloc(sizeof *e->cuts);
    if (!e->text || !e->ids || !e->cuts) {
        entry_free(e);
        return err_set(err, INFERD_ENOMEM, "out of memory for a remembered generation of %zu bytes",
                       prompt_len + keep_len);
    }
    memcpy(e->text, prompt_text, prompt_len);
    memcpy(e->text + prompt_len, gen_text, keep_len);
    memcpy(e->ids, prompt_ids, (size_t)n_prompt * sizeof *e->ids);
    memcpy(e->ids + n_prompt, gen_ids, (size_t)keep * sizeof *e->ids);
    e->cuts[0] = (struct cut){e->len, e->n_ids};
    e->n_cuts = 1;
    if (entry_bytes(e) > r->max_bytes) {
        entry_free(e); /* would evict everything and still not fit */
        return 0;
    }

    struct entry *dropped = NULL; /* replaced or evicted, freed after the lock */
    pthread_mutex_lock(&r->mu);
    /* Older entries of this branch: their cuts move here and they go. */
    for (struct entry *o = r->head, *next; o; o = next) {
        next = o->next;
        if (o->ns != ns || o->add_special != add_special ||
            !covered_by(o, e->text, e->len, e->ids, e->n_ids))
            continue;
        struct cut *grown = realloc(e->cuts, ((size_t)e->n_cuts + (size_t)o->n_cuts) * sizeof *grown);
        if (!grown)
            break; /* the older entry simply stays */
        e->cuts = grown;
        memcpy(e->cuts + e->n_cuts, o->cuts, (size_t)o->n_cuts * sizeof *o->cuts);
        e->n_cuts += o->n_cuts;
        list_unlink(r, o);
        o->next = dropped;
        dropped = o;
    }
    qsort(e->cuts, (size_t)e->n_cuts, sizeof *e->cuts, cut_cmp);
    int n = 0;
    for (int i = 0; i < e->n_cuts; i++)
        if (n == 0 || e->cuts[i].off != e->cuts[n - 1].off)
            e->cuts[n++] = e->cuts[i];
    e->n_cuts = n;
    e->bytes = entry_bytes(e);
    list_push_front(r, e);
    while (r->bytes > r->max_bytes && r->tail) {
        struct entry *lru = r->tail; /* the new entry itself only if its merged cuts overflow */
        list_unlink(r, lru);
        lru->next = dropped;
        dropped = lru;
        r->evictions++;
    }
    pthread_mutex_unlock(&r->mu);
    while (dropped) {
        struct entry *next = dropped->next;
        entry_free(dropped);
        dropped = next;
    }
    return 0;
}

void reencode_get_stats(struct reencode *r, struct reencode_stats *out)
{
    pthread_mutex_lock(&r->mu);
    *out = (struct reencode_stats){
        .entries = r->n_entries,
        .bytes = r->bytes,
        .max_bytes = r->max_bytes,
        .hits = r->hits,
        .misses = r->misses,
        .evictions = r->evictions,
    };
    pthread_mutex_unlock(&r->mu);
}
