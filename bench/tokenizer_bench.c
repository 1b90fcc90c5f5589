/* bench/tokenizer_bench.c — times tok_encode over a file of NUL-separated documents (made by bench/tokenizer_speed.js). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/tokenizer.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Reads a whole file; caller frees. */
static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        *len = (size_t)n;
    }
    return buf;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s TOKENIZER_DIR NAME DOCS_FILE\n", argv[0]);
        return 2;
    }
    struct err err = {0};
    struct tokenizer *tok = NULL;
    double t_load = now_s();
    if (tok_load(argv[1], &tok, &err) != 0) {
        fprintf(stderr, "tokenizer_bench: %s: %s\n", argv[1], err.msg);
        return 1;
    }
    t_load = now_s() - t_load;
    size_t len = 0;
    char *text = read_file(argv[3], &len);
    if (!text) {
        fprintf(stderr, "tokenizer_bench: cannot read %s\n", argv[3]);
        tok_free(tok);
        return 1;
    }

    /* Warm-up on the first document, as the Rust side does. */
    int32_t *ids = NULL;
    int n_ids = 0;
    size_t first = strnlen(text, len);
    if (tok_encode(tok, text, first, false, &ids, &n_ids, &err) != 0) {
        fprintf(stderr, "tokenizer_bench: encode: %s\n", err.msg);
        return 1;
    }
    free(ids);

    long long tokens = 0;
    size_t docs = 0, bytes = 0;
    double t0 = now_s();
    for (size_t at = 0; at <= len;) {
        size_t n = strnlen(text + at, len - at);
        ids = NULL;
        if (tok_encode(tok, text + at, n, false, &ids, &n_ids, &err) != 0) {
            fprintf(stderr, "tokenizer_bench: encode document %zu: %s\n", docs, err.msg);
            return 1;
        }
        free(ids);
        tokens += n_ids;
        bytes += n;
        docs++;
        at += n + 1;
    }
    double s = now_s() - t0;
    printf("c %s bytes=%zu docs=%zu tokens=%lld seconds=%.3f mb_per_s=%.2f load_seconds=%.3f\n", argv[2], bytes,
           docs, tokens, s, (double)bytes / 1e6 / s, t_load);
    free(text);
    tok_free(tok);
    return 0;
}
