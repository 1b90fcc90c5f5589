/* cli/tier.c — the SSD tier's fingerprint digests, backend identity and start-up prefill probe
 * for `inferd serve --ssd-cache`. */
#include "cli/tier.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/matmul.h"
#include "backend/cuda/cuda.h"
#include "base/timer.h"
#include "engine/generate.h"
#include "model/gguf.h"

#define TIER_READ_CHUNK ((size_t)1 << 20)

uint64_t cli_tier_weights_digest(const struct model *m)
{
    XXH3_state_t *st = XXH3_createState();
    if (!st) /* the mappings' sizes then stand in; the engine's digest still has the names */
        return 0;
    XXH3_64bits_reset(st);
    for (int i = 0; i < m->files.n_files; i++) {
        uint64_t len = m->files.map_lens[i];
        XXH3_64bits_update(st, m->files.maps[i], (size_t)len);
        XXH3_64bits_update(st, &len, sizeof len);
    }
    uint64_t h = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return h;
}

/* Streams path into st; *missing (may be NULL) says it did not exist. */
static int digest_file(XXH3_state_t *st, char *buf, const char *path, bool *missing,
                       struct err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (missing && errno == ENOENT) {
            *missing = true;
            return 0;
        }
        return err_set(err, INFERD_EIO, "%s: %s", path, strerror(errno));
    }
    size_t n;
    while ((n = fread(buf, 1, TIER_READ_CHUNK, f)) > 0)
        XXH3_64bits_update(st, buf, n);
    int bad = ferror(f);
    fclose(f);
    if (bad)
        return err_set(err, INFERD_EIO, "%s: read error", path);
    return 0;
}

int cli_tier_tokenizer_digest(const char *dir, uint64_t *out, struct err *err)
{
    XXH3_state_t *st = XXH3_createState();
    char *buf = malloc(TIER_READ_CHUNK);
    char path[4096];
    int rc = 0;
    if (!st || !buf) {
        rc = err_set(err, INFERD_ENOMEM, "out of memory for the tokenizer's digest");
        goto done;
    }
    XXH3_64bits_reset(st);
    if (gguf_is_file(dir)) { /* a GGUF file's tokenizer is in its metadata, before the data */
        struct gguf_file f;
        if ((rc = gguf_open(dir, &f, err)) < 0)
            goto done;
        XXH3_64bits_update(st, f.image, (size_t)f.data_offset);
        gguf_close(&f);
        *out = XXH3_64bits_digest(st);
        goto done;
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if ((rc = digest_file(st, buf, path, NULL, err)) < 0)
        goto done;
    bool missing = false;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if ((rc = digest_file(st, buf, path, &missing, err)) < 0)
        goto done;
    *out = XXH3_64bits_digest(st);
done:
    free(buf);
    XXH3_freeState(st);
    return rc;
}

void cli_tier_backend_identity(struct backend *be, char *buf, size_t cap)
{
    const char *mode = be->mode == COMPUTE_EXACT ? "exact" : "fast";
    struct cpu_matmul *mm = backend_cpu_matmul(be);
    if (mm) {
        snprintf(buf, cap, "cpu-%s-%s", cpu_matmul_level_name(cpu_matmul_get_level(mm)), mode);
        return;
    }
    /* "NVIDIA H200, 139.8 GiB, sm_90": the name and the capability, not the memory */
    char gpu[200];
    backend_cuda_describe(be, gpu, sizeof gpu);
    const char *comma = strchr(gpu, ',');
    const char *sm = strrchr(gpu, ',');
    int name_len = comma ? (int)(comma - gpu) : (int)strlen(gpu);
    snprintf(buf, cap, "%s-%.*s-%s-%s", be->ops->name, name_len, gpu, sm ? sm + 2 : "", mode);
}

int cli_tier_measure_prefill(const struct model *m, int n_tokens, int chunk, double *tokens_per_s,
                             struct err *err)
{
    struct generator *g = NULL;
    int32_t *ids = malloc((size_t)n_tokens * sizeof *ids);
    if (!ids)
        return err_set(err, INFERD_ENOMEM, "out of memory for the prefill probe");
    uint64_t state = 42;
    for (int i = 0; i < n_tokens; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((state >> 33) % (uint64_t)m->config.vocab_size);
    }
    int rc = generator_create(m, n_tokens + 1, chunk, &g, err);
    double best = 0;
    for (int run = 0; rc == 0 && run < 2; run++) {
        generator_reset(g);
        uint64_t t0 = now_ns();
        rc = generator_feed(g, ids, n_tokens, err);
        double s = (double)(now_ns() - t0) * 1e-9;
        if (rc == 0 && s > 0 && n_tokens / s > best)
            best = n_tokens / s;
    }
    generator_free(g);
    free(ids);
    if (rc == 0)
        *tokens_per_s = best;
    return rc;
}
