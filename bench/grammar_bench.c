/* bench/grammar_bench.c — structured output's costs on a real vocabulary: compile time and
 * per-token mask time (median, p99) for ten representative JSON schemas.
 *
 * Usage: grammar_bench [TOKENIZER_DIR [GENERATIONS [prepare]]]
 *   TOKENIZER_DIR defaults to $INFERD_TOKENIZER_DATA/qwen3 (Qwen3: 151,936 tokens).
 * Each schema is compiled fresh 5 times (median), then GENERATIONS (default 8) random
 * generations run through one matcher each: at every step the mask is filled (timed) and a
 * random allowed token taken (after a while, preferably one that closes a string, object
 * or array, so answers end). The first generation over a grammar fills its per-state cache
 * ("cold"); the later ones reuse it as a serving process does for a schema it has seen
 * ("warm"). Targets: mask median ≤ 50 µs, p99 ≤ 500 µs; compile ≤ 50 ms. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "base/timer.h"
#include "grammar/grammar.h"
#include "text/tokenizer.h"

#define MAX_STEPS 160

static const struct {
    const char *name, *schema;
} schemas[] = {
    {"flat object",
     "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},\"email\":"
     "{\"type\":\"string\"},\"active\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"age\",\"email\",\"active\"],"
     "\"additionalProperties\":false}"},
    {"nested objects",
     "{\"type\":\"object\",\"properties\":{\"user\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},"
     "\"profile\":{\"type\":\"object\",\"properties\":{\"first\":{\"type\":\"string\"},\"last\":{\"type\":\"string\"},"
     "\"address\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"zip\":{\"type\":\"string\"}},"
     "\"required\":[\"city\",\"zip\"]}},\"required\":[\"first\",\"last\",\"address\"]}},\"required\":[\"id\",\"profile\"]}},"
     "\"required\":[\"user\"]}"},
    {"array of objects",
     "{\"type\":\"object\",\"properties\":{\"items\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":"
     "{\"sku\":{\"type\":\"string\"},\"qty\":{\"type\":\"integer\",\"minimum\":1},\"price\":{\"type\":\"number\"}},"
     "\"required\":[\"sku\",\"qty\",\"price\"]},\"maxItems\":6}},\"required\":[\"items\"]}"},
    {"enums",
     "{\"type\":\"object\",\"properties\":{\"color\":{\"enum\":[\"red\",\"green\",\"blue\",\"yellow\",\"purple\"]},"
     "\"size\":{\"enum\":[\"S\",\"M\",\"L\",\"XL\"]},\"mood\":{\"enum\":[\"happy\",\"sad\",\"angry\",\"calm\",null]}},"
     "\"required\":[\"color\",\"size\",\"mood\"]}"},
    {"anyOf",
     "{\"type\":\"object\",\"properties\":{\"result\":{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"ok\":{\"type\":"
     "\"boolean\"},\"value\":{\"type\":\"number\"}},\"required\":[\"ok\",\"value\"]},{\"type\":\"object\",\"properties\":"
     "{\"error\":{\"type\":\"string\"},\"code\":{\"type\":\"integer\"}},\"required\":[\"error\",\"code\"]},{\"type\":\"null\"}]}},"
     "\"required\":[\"result\"]}"},
    {"$ref recursion",
     "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"label\":{\"type\":\"string\"},\"children\":{\"type\":"
     "\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":3}},\"required\":[\"label\",\"children\"]}},"
     "\"$ref\":\"#/$defs/node\"}"},
    {"string pattern",
     "{\"type\":\"object\",\"properties\":{\"phone\":{\"type\":\"string\",\"pattern\":\"^\\\\+?[0-9]{1,3}-[0-9]{3}-[0-9]{4}$\"},"
     "\"code\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{3}[0-9]{2,4}$\"},\"slug\":{\"type\":\"string\",\"pattern\":"
     "\"^[a-z0-9]+(-[a-z0-9]+)*$\"}},\"required\":[\"phone\",\"code\",\"slug\"]}"},
    {"formats",
     "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\",\"format\":\"uuid\"},\"at\":{\"type\":\"string\","
     "\"format\":\"date-time\"},\"day\":{\"type\":\"string\",\"format\":\"date\"},\"mail\":{\"type\":\"string\",\"format\":"
     "\"email\"},\"ip\":{\"type\":\"string\",\"format\":\"ipv4\"}},\"required\":[\"id\",\"at\",\"day\",\"mail\",\"ip\"]}"},
    {"numeric bounds",
     "{\"type\":\"object\",\"properties\":{\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":130},\"temp\":{\"type\":"
     "\"number\",\"minimum\":-40,\"maximum\":60},\"ratio\":{\"type\":\"number\",\"minimum\":0,\"maximum\":1},\"year\":"
     "{\"type\":\"integer\",\"minimum\":1900,\"exclusiveMaximum\":2100}},\"required\":[\"age\",\"temp\",\"ratio\",\"year\"]}"},
    {"OpenAI function params",
     "{\"type\":\"object\",\"properties\":{\"location\":{\"type\":\"string\",\"description\":\"City and country\"},"
     "\"unit\":{\"type\":[\"string\",\"null\"],\"enum\":[\"celsius\",\"fahrenheit\",null]},\"days\":{\"type\":\"integer\","
     "\"minimum\":1,\"maximum\":14},\"include\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"enum\":[\"wind\","
     "\"humidity\",\"uv\"]},\"maxItems\":3}},\"required\":[\"location\",\"unit\",\"days\",\"include\"],"
     "\"additionalProperties\":false}"},
};
#define N_SCHEMAS ((int)(sizeof schemas / sizeof schemas[0]))

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static double pct(uint64_t *v, int n, double p)
{
    if (!n)
        return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_u64);
    int i = (int)(p * (n - 1) + 0.5);
    return (double)v[i] * 1e-3;
}

/* One random generation; appends each mask's time (ns) to t. Returns the steps taken. */
static int generate(struct grammar *g, struct grammar_vocab *v, uint64_t *t, int32_t *allowed,
                    int32_t *closing, uint32_t *bits)
{
    struct grammar_matcher *m = NULL;
    struct err e = {0};
    if (grammar_matcher_create(g, v, &m, &e)) {
        fprintf(stderr, "grammar_bench: %s\n", e.msg);
        exit(1);
    }
    int n = grammar_vocab_size(v), steps = 0;
    for (; steps < MAX_STEPS; steps++) {
        bool eos;
        uint64_t t0 = now_ns();
        if (grammar_matcher_fill_mask(m, bits, &eos))
            exit(1);
        t[steps] = now_ns() - t0;
        int na = 0, nc = 0;
        for (int w = 0; w < (n + 31) / 32; w++)
            for (uint32_t x = bits[w]; x; x &= x - 1) {
                int32_t tok = w * 32 + __builtin_ctz(x);
                allowed[na++] = tok;
                size_t len;
                const char *p = grammar_vocab_token(v, tok, &len);
                if (memchr(p, '"', len) || memchr(p, '}', len) || memchr(p, ']', len))
                    closing[nc++] = tok;
            }
        if (eos && (!na || rnd() % 2 == 0)) {
            steps++;
            break;
        }
        if (!na)
            break;
        int32_t tok = steps > 12 && nc && rnd() % 4 ? closing[rnd() % (uint64_t)nc]
                                                    : allowed[rnd() % (uint64_t)na];
        if (grammar_matcher_accept_token(m, tok))
            exit(1);
    }
    grammar_matcher_free(m);
    return steps;
}

int main(int argc, char **argv)
{
    char dir[1024];
    const char *data = getenv("INFERD_TOKENIZER_DATA");
    if (argc > 1)
        snprintf(dir, sizeof dir, "%s", argv[1]);
    else if (data)
        snprintf(dir, sizeof dir, "%s/qwen3", data);
    else {
        fprintf(stderr, "usage: grammar_bench TOKENIZER_DIR [GENERATIONS] (or set INFERD_TOKENIZER_DATA)\n");
        return 2;
    }
    int gens = argc > 2 ? atoi(argv[2]) : 8;
    bool prepare = argc > 3 && !strcmp(argv[3], "prepare");
    if (gens < 2)
        gens = 2;
    struct tokenizer *tok = NULL;
    struct grammar_vocab *v = NULL;
    struct err e = {0};
    uint64_t t0 = now_ns();
    if (tok_load(dir, &tok, &e) || grammar_vocab_create(tok, &v, &e)) {
        fprintf(stderr, "grammar_bench: %s\n", e.msg);
        return 1;
    }
    double vocab_ms = (double)(now_ns() - t0) * 1e-6;
    char model[512] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "model name", 10)) {
                char *c = strchr(line, ':');
                snprintf(model, sizeof model, "%s", c ? c + 2 : line);
                model[strcspn(model, "\n")] = 0;
                break;
            }
        fclose(f);
    }
    int n = grammar_vocab_size(v);
    printf("machine: %s, %d logical CPUs, ISA %s (one thread)\n", model, cpu_features()->n_cores,
           cpu_level_name(cpu_features()));
    printf("vocabulary: %s, %d tokens (loaded and indexed in %.0f ms)\n", dir, n, vocab_ms);
    printf("%d generations per schema, at most %d steps each; times in microseconds\n\n", gens, MAX_STEPS);
    printf("%-24s %6s %9s %9s | %8s %8s %8s | %8s %8s %8s\n", "schema", "states", "compile", "prepare", "cold med",
           "cold p99", "cold max", "warm med", "warm p99", "warm max");
    uint32_t *bits = calloc(((size_t)n + 31) / 32, sizeof *bits);
    int32_t *allowed = malloc((size_t)n * sizeof *allowed);
    int32_t *closing = malloc((size_t)n * sizeof *closing);
    uint64_t *cold = malloc(MAX_STEPS * sizeof *cold);
    uint64_t *warm = malloc((size_t)gens * MAX_STEPS * sizeof *warm);
    uint64_t *all_warm = malloc((size_t)N_SCHEMAS * gens * MAX_STEPS * sizeof *all_warm);
    uint64_t *all_cold = malloc((size_t)N_SCHEMAS * MAX_STEPS * sizeof *all_cold);
    int n_all_warm = 0, n_all_cold = 0;
    double worst_compile = 0;
    for (int s = 0; s < N_SCHEMAS; s++) {
        uint64_t ct[5];
        struct grammar *g = NULL;
        for (int k = 0; k < 5; k++) {
            uint64_t c0 = now_ns();
            if (grammar_compile_json_schema(schemas[s].schema, strlen(schemas[s].schema), NULL, &g, &e)) {
                fprintf(stderr, "grammar_bench: %s: %s\n", schemas[s].name, e.msg);
                return 1;
            }
            ct[k] = now_ns() - c0;
            if (k < 4)
                grammar_free(g);
        }
        double compile_ms = pct(ct, 5, 0.5) * 1e-3;
        if (compile_ms > worst_compile)
            worst_compile = compile_ms;
        rng = 0x9E3779B97F4A7C15ull + (uint64_t)s;
        double prep_ms = 0;
        if (prepare) {
            struct grammar_matcher *m = NULL;
            uint64_t p0 = now_ns();
            if (grammar_matcher_create(g, v, &m, &e) || grammar_matcher_prepare(m))
                return 1;
            prep_ms = (double)(now_ns() - p0) * 1e-6;
            grammar_matcher_free(m);
        }
        int nc = generate(g, v, cold, allowed, closing, bits);
        int nw = 0;
        for (int k = 1; k < gens; k++)
            nw += generate(g, v, warm + nw, allowed, closing, bits);
        memcpy(all_cold + n_all_cold, cold, (size_t)nc * sizeof *cold);
        n_all_cold += nc;
        memcpy(all_warm + n_all_warm, warm, (size_t)nw * sizeof *warm);
        n_all_warm += nw;
        double cm = pct(cold, nc, 0.5), c99 = pct(cold, nc, 0.99), cx = pct(cold, nc, 1.0);
        double wm = pct(warm, nw, 0.5), w99 = pct(warm, nw, 0.99), wx = pct(warm, nw, 1.0);
        printf("%-24s %6d %7.2fms %7.1fms | %8.1f %8.1f %8.1f | %8.1f %8.1f %8.1f\n", schemas[s].name,
               grammar_n_states(g), compile_ms, prep_ms, cm, c99, cx, wm, w99, wx);
        grammar_free(g);
    }
    printf("\nall schemas: cold median %.1f us, p99 %.1f us (%d masks); warm median %.1f us, p99 %.1f us "
           "(%d masks); slowest compile %.2f ms\n",
           pct(all_cold, n_all_cold, 0.5), pct(all_cold, n_all_cold, 0.99), n_all_cold,
           pct(all_warm, n_all_warm, 0.5), pct(all_warm, n_all_warm, 0.99), n_all_warm, worst_compile);
    printf("targets: median <= 50 us, p99 <= 500 us, compile <= 50 ms\n");
    free(bits);
    free(allowed);
    free(closing);
    free(cold);
    free(warm);
    free(all_warm);
    free(all_cold);
    grammar_vocab_free(v);
    tok_free(tok);
    return 0;
}
