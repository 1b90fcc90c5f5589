/* fuzz/fuzz_prefix.c — libFuzzer target: the prefix cache under arbitrary token sequences, inserted,
 * looked up, held, released and evicted; every hit's K/V must be the K/V of its own tokens. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv.h"

#define BS 4
#define N_BLOCKS 24
#define MAX_SEQS 6
#define MAX_TOKENS 40

struct held {
    struct kv_seq kv;
    int32_t tokens[MAX_TOKENS];
    int n;
    bool live;
};

/* What a position's K (V: negated) holds once computed: its namespace, token
 * and position, so a block reused under the wrong prefix or tenant shows. */
static float value_of(uint64_t ns, int32_t token, int pos)
{
    return (float)(ns * 65536 + (uint64_t)token * 256 + (uint64_t)pos + 1);
}

static void check_kv(struct kv_manager *mgr, const struct held *h, int n)
{
    struct kv_cache *kv = kv_manager_cache(mgr);
    const float *k = kv->k, *v = kv->v;
    for (int pos = 0; pos < n; pos++) {
        size_t off = ((size_t)h->kv.table.blocks[pos / BS] * BS + pos % BS); /* 1 layer, kv_dim 1 */
        float want = value_of(h->kv.ns, h->tokens[pos], pos);
        if (k[off] != want || v[off] != -want)
            __builtin_trap();
    }
}

static uint8_t next(const uint8_t **data, size_t *size)
{
    if (*size == 0)
        return 0;
    (*size)--;
    return *(*data)++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct backend *be;
    struct err err = {0};
    if (!be && backend_cpu_create(&(struct backend_options){.threads = 1}, &be, &err) < 0)
        return 0;
    struct model m = {0};
    m.config.n_layers = 1;
    m.config.n_kv_heads = 1;
    m.config.head_dim = 1;
    m.backend = be;
    struct kv_manager *mgr = NULL;
    if (kv_manager_create(&m, be, N_BLOCKS, BS, &mgr, &err) < 0)
        return 0;
    struct kv_format f = kv_format_of_dtype(be->kv_dtype);
    size_t block_bytes = kv_format_bytes_per_block(&m.config, &f, BS);
    uint8_t first = next(&data, &size);
    struct kv_prefix_config cfg = {.max_bytes = block_bytes * (1 + first % 20),
                                   .retention = first & 0x80 ? KV_RETAIN_COST_SIZE : KV_RETAIN_LRU,
                                   .model_digest = 1, .session_idle_ns = 10};
    if (kv_manager_prefix_enable(mgr, &cfg, &err) < 0)
        __builtin_trap();
    static const char *const sessions[] = {"a", "b"};
    struct held seqs[MAX_SEQS];
    memset(seqs, 0, sizeof seqs);
    uint64_t clock = 0;
    while (size > 0) {
        uint8_t op = next(&data, &size);
        struct held *h = &seqs[(op >> 3) % MAX_SEQS];
        switch (op % 4) {
        case 0: { /* a sequence: lookup, compute the rest, publish; it stays held */
            if (h->live) {
                kv_manager_free(mgr, &h->kv);
                free(h->kv.table.blocks);
            }
            kv_seq_init(&h->kv);
            h->live = true;
            uint8_t spec = next(&data, &size);
            h->kv.ns = spec & 1;
            h->kv.session = spec & 2 ? sessions[(spec >> 2) & 1] : NULL;
            h->n = 1 + next(&data, &size) % MAX_TOKENS;
            for (int i = 0; i < h->n; i++) /* a small alphabet, so prefixes repeat */
                h->tokens[i] = next(&data, &size) % 3;
            int cached = kv_manager_computed_blocks(mgr, &h->kv, h->tokens, h->n);
            if (cached < 0 || cached >= h->n || (h->n > 1 && cached > h->n - 1))
                __builtin_trap();
            check_kv(mgr, h, cached);
            if (kv_manager_allocate_slots(mgr, &h->kv, h->n - cached, &err) < 0) {
                kv_manager_free(mgr, &h->kv);
                free(h->kv.table.blocks);
                h->live = false;
                break;
            }
            struct kv_cache *kv = kv_manager_cache(mgr);
            for (int pos = cached; pos < h->n; pos++) {
                size_t off = (size_t)h->kv.table.blocks[pos / BS] * BS + pos % BS;
                ((float *)kv->k)[off] = value_of(h->kv.ns, h->tokens[pos], pos);
                ((float *)kv->v)[off] = -value_of(h->kv.ns, h->tokens[pos], pos);
            }
            kv_manager_publish(mgr, &h->kv, h->tokens, h->n);
            check_kv(mgr, h, h->n);
            break;
        }
        case 1: /* it finishes, leaving its partial last block too */
            if (h->live) {
                check_kv(mgr, h, h->n);
                kv_manager_retire(mgr, &h->kv, h->tokens, h->n);
                free(h->kv.table.blocks);
                h->live = false;
            }
            break;
        case 2: /* time passes; a session may close */
            clock += next(&data, &size) % 8;
            kv_manager_tick(mgr, clock);
            if (op & 0x40)
                kv_manager_close_session(mgr, sessions[(op >> 7) & 1]);
            break;
        case 3: /* rolled back into its blocks: never writes a shared one */
            if (h->live) {
                kv_manager_truncate(mgr, &h->kv, next(&data, &size) % (h->n + 1));
                h->n = h->kv.n_tokens;
                check_kv(mgr, h, h->n);
            }
            break;
        }
        for (int i = 0; i < MAX_SEQS; i++)
            if (seqs[i].live)
                check_kv(mgr, &seqs[i], seqs[i].n);
    }
    for (int i = 0; i < MAX_SEQS; i++)
        if (seqs[i].live) {
            kv_manager_free(mgr, &seqs[i].kv);
            free(seqs[i].kv.table.blocks);
        }
    struct kv_prefix_stats st;
    kv_manager_prefix_stats(mgr, &st);
    if (st.unreferenced_blocks * block_bytes > cfg.max_bytes)
        __builtin_trap();
    kv_manager_prefix_clear(mgr);
    if (kv_manager_free_blocks(mgr) != N_BLOCKS)
        __builtin_trap(); /* a reference leaked */
    kv_manager_destroy(mgr);
    return 0;
}
