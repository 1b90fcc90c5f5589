/* backend/cuda/sample.cu — token sampling on the GPU: logit adjustments, greedy and truncated or
 * plain temperature sampling, and the numbers logprobs need, so only results cross to the host.
 *
 * The semantics are the host sampler's (the comment above sample_spec in
 * backend.h). One call runs these launches on the backend's stream, after
 * the step's recorded work:
 *   adjust        the sparse per-token adjustments, in place in the logits;
 *   mask          rows with an allowed-token bitset (structured output): -inf
 *                 for every token whose bit is clear;
 *   chunk_stats   per (chunk of the vocabulary, row): max, its lowest id,
 *                 the count of +inf, and the chunk's SAMPLE_K best
 *                 candidates by logit (ties lower id first), in id order;
 *   chunk_sums    per (chunk, row), once the row's max M is known: the
 *                 double sums of expf(x - M) and expf((x - M) / T);
 *   row_pick      per row: greedy, or the SAMPLE_K best candidates ranked
 *                 by probability with top-k, min-p and top-p applied and u
 *                 drawn over them; the logprobs numbers;
 *   walk_sums,    for plain temperature sampling (no truncation), which
 *   walk_pick     walks ids in increasing order: per chunk the double sum
 *                 of the probabilities, then the chunk and id where u's
 *                 running sum is crossed.
 * Every reduction has a fixed shape, so the same logits, parameters and u
 * give the same token every time. A truncation that the SAMPLE_K candidates
 * cannot settle (top-p not reached inside them, say, with top_k 0) or
 * sampling over a +inf logit hands the row to the host (need_host). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/sample.h"

#define SAMPLE_THREADS 256
#define SAMPLE_K 128          /* candidates per chunk and per row; a power of two */
#define SAMPLE_MAX_CHUNKS 40  /* chunks per row: row_pick merges SAMPLE_MAX_CHUNKS * SAMPLE_K */
#define SAMPLE_MIN_CHUNK 2048 /* vocabulary entries per chunk, at least */
#define SAMPLE_NO_ID INT32_MAX /* a padding candidate's id: ranks after every real one */

enum sample_mode { MODE_GREEDY = 0, MODE_TRUNCATE = 1, MODE_WALK = 2 };

/* A row's parameters as the kernels read them. */
struct dev_spec {
    double u;
    float temperature, top_p, min_p, rep, presence, frequency;
    int top_k;
    int n_top;      /* -1: no logprobs */
    int mode;       /* sample_mode */
    int need_sums;  /* the sums over the row are read (sampling or logprobs) */
    int need_cands; /* the best candidates are read (truncation or top logprobs) */
    int mask_row;   /* the row's bitset among the uploaded masks; -1: no mask */
};

struct dev_adjust {
    int row, token, count, repeat;
    float bias;
};

struct chunk_stat {
    float max;
    int argmax; /* lowest id holding max; SAMPLE_NO_ID when nothing above -inf */
    int n_inf;  /* +inf logits */
    int pad;
};

struct chunk_sum {
    double z1; /* sum of expf(x - M) */
    double zt; /* sum of expf((x - M) / T) */
};

struct candidate {
    float x;
    int id;
};

struct cu_sampler {
    /* pinned: the specs then the adjustments, copied in one transfer */
    uint8_t *staging;
    size_t staging_cap;
    struct sample_result *results_host; /* pinned */
    int results_cap;
    /* device */
    uint8_t *params; /* staging's copy */
    size_t params_cap;
    struct chunk_stat *stats;
    struct chunk_sum *sums;
    double *walk_sums;
    struct candidate *cands;
    struct sample_result *results;
    int *walk_pending;
    int part_cap; /* rows x chunks the partials hold */
    int rows_cap;
};

/* ---- helpers -------------------------------------------------------------- */

/* NaN counts as -inf; -0 as +0 (they compare equal, so neither may outrank the other). */
static __device__ __forceinline__ float canon(float x)
{
    if (x != x)
        return -INFINITY;
    return x == 0.0f ? 0.0f : x;
}

/* Order-preserving unsigned key of a canonical float. */
static __device__ __forceinline__ unsigned key_of(float x)
{
    unsigned u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* expf((x - M) / T), rounded as the host rounds each step. */
static __device__ __forceinline__ float weight_of(float x, float max, float t)
{
    return expf(__fdiv_rn(__fsub_rn(x, max), t));
}

/* Exclusive prefix sum over the block (blockDim.x a multiple of 32, at most
 * 1024); *total gets the block's sum. Fixed shape: deterministic. */
template <typename T>
static __device__ T block_exclusive_scan(T v, T *total)
{
    __shared__ T warp_sums[33];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    T inc = v;
    for (int o = 1; o < 32; o <<= 1) {
        T n = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o)
            inc += n;
    }
    if (lane == 31)
        warp_sums[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        T w = lane < n_warps ? warp_sums[lane] : (T)0, winc = w;
        for (int o = 1; o < 32; o <<= 1) {
            T n = __shfl_up_sync(0xffffffffu, winc, o);
            if (lane >= o)
                winc += n;
        }
        if (lane < n_warps)
            warp_sums[lane] = winc - w;
        if (lane == n_warps - 1)
            warp_sums[32] = winc;
    }
    __syncthreads();
    T before = warp_sums[warp] + inc - v;
    *total = warp_sums[32];
    __syncthreads();
    return before;
}

template <typename T>
static __device__ T block_sum(T v)
{
    T total;
    block_exclusive_scan(v, &total);
    return total;
}

/* The threshold of the k best of n keys (k <= n): on return *kth is the
 * k-th largest key and *ties how many of the keys equal to it belong to the
 * k best (the lowest-index ones). Radix select, 8 bits a pass. */
template <class KeyAt>
static __device__ void radix_select(KeyAt key_at, int n, int k, unsigned *kth, int *ties)
{
    __shared__ unsigned hist[256];
    __shared__ unsigned found[2];
    unsigned prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x)
            hist[i] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            unsigned key = key_at(i);
            if ((key & mask) == prefix)
                atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            /* lane l holds digits 255 - 8l down to 248 - 8l */
            int lane = threadIdx.x;
            unsigned mine = 0;
            for (int j = 0; j < 8; j++)
                mine += hist[255 - 8 * lane - j];
            unsigned inc = mine;
            for (int o = 1; o < 32; o <<= 1) {
                unsigned v = __shfl_up_sync(0xffffffffu, inc, o);
                if (lane >= o)
                    inc += v;
            }
            unsigned above = inc - mine;
            if (above < (unsigned)k && (unsigned)k <= inc) {
                for (int j = 0; j < 8; j++) {
                    unsigned h = hist[255 - 8 * lane - j];
                    if ((unsigned)k <= above + h) {
                        found[0] = 255u - 8u * lane - j;
                        found[1] = (unsigned)k - above;
                        break;
                    }
                    above += h;
                }
            }
        }
        __syncthreads();
        prefix |= found[0] << shift;
        mask |= 255u << shift;
        k = (int)found[1];
        __syncthreads();
    }
    *kth = prefix;
    *ties = k;
}

/* Calls emit(i, slot) for the k best of n keys, slot = their rank in index
 * order (so ties at the threshold go to the lowest indices). */
template <class KeyAt, class Emit>
static __device__ void select_best(KeyAt key_at, int n, int k, Emit emit)
{
    unsigned kth;
    int ties;
    radix_select(key_at, n, k, &kth, &ties);
    int per = (n + blockDim.x - 1) / blockDim.x;
    int lo = threadIdx.x * per, hi = min(n, lo + per);
    int greater = 0, equal = 0;
    for (int i = lo; i < hi; i++) {
        unsigned key = key_at(i);
        greater += key > kth;
        equal += key == kth;
    }
    int total;
    int equal_before = block_exclusive_scan(equal, &total);
    int take_equal = min(equal, max(0, ties - equal_before));
    int slot = block_exclusive_scan(greater + take_equal, &total);
    for (int i = lo; i < hi; i++) {
        unsigned key = key_at(i);
        if (key > kth || (key == kth && take_equal-- > 0))
            emit(i, slot++);
    }
    __syncthreads();
}

/* Sorts n (a power of two) entries in shared memory so that before(a, b)
 * holds for each earlier a and later b; before must be a strict total order. */
template <class Before, class Swap>
static __device__ void bitonic_sort(int n, Before before, Swap swap)
{
    for (int size = 2; size <= n; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int t = threadIdx.x; t < n / 2; t += blockDim.x) {
                int i = 2 * t - (t & (stride - 1)), j = i + stride;
                bool up = (i & size) == 0;
                if (up ? before(j, i) : before(i, j))
                    swap(i, j);
            }
            __syncthreads();
        }
}

/* ---- kernels -------------------------------------------------------------- */

static __global__ void adjust_kernel(float *logits, int vocab, const struct dev_spec *specs,
                                     const struct dev_adjust *adj, int n_adj)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_adj)
        return;
    struct dev_adjust a = adj[i];
    const struct dev_spec *sp = &specs[a.row];
    float *x = &logits[(size_t)a.row * vocab + a.token];
    float v = __fadd_rn(*x, a.bias);
    if (a.repeat)
        v = v > 0 ? __fdiv_rn(v, sp->rep) : __fmul_rn(v, sp->rep);
    if (a.count > 0)
        v = __fsub_rn(__fmaf_rn(-sp->frequency, (float)a.count, v), sp->presence);
    *x = v;
}

/* One thread per (token, row): a masked-out token's logit becomes -inf (step 1b). */
static __global__ void mask_kernel(float *logits, int vocab, const struct dev_spec *specs,
                                   const uint32_t *masks, int words)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x, row = blockIdx.y;
    int m = specs[row].mask_row;
    if (t >= vocab || m < 0)
        return;
    if (!((masks[(size_t)m * words + (t >> 5)] >> (t & 31)) & 1u))
        logits[(size_t)row * vocab + t] = -INFINITY;
}

static __global__ void __launch_bounds__(SAMPLE_THREADS)
chunk_stats_kernel(const float *logits, int vocab, int chunk, const struct dev_spec *specs,
                   struct chunk_stat *stats, struct candidate *cands)
{
    int row = blockIdx.y, c = blockIdx.x, n_chunks = gridDim.x;
    int base = c * chunk, n = min(chunk, vocab - base);
    const float *x = logits + (size_t)row * vocab + base;

    float best = -INFINITY;
    int best_i = SAMPLE_NO_ID, n_inf = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = canon(__ldg(&x[i]));
        if (v > best) {
            best = v;
            best_i = i;
        }
        n_inf += v == INFINITY;
    }
    /* (max, lowest index) over the block */
    __shared__ float red_v[SAMPLE_THREADS];
    __shared__ int red_i[SAMPLE_THREADS];
    red_v[threadIdx.x] = best;
    red_i[threadIdx.x] = best_i;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float ov = red_v[threadIdx.x + s];
            int oi = red_i[threadIdx.x + s];
            if (ov > red_v[threadIdx.x] || (ov == red_v[threadIdx.x] && oi < red_i[threadIdx.x])) {
                red_v[threadIdx.x] = ov;
                red_i[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    int infs = block_sum(n_inf);
    if (threadIdx.x == 0) {
        struct chunk_stat st;
        st.max = red_v[0];
        st.argmax = red_i[0] == SAMPLE_NO_ID ? SAMPLE_NO_ID : base + red_i[0];
        st.n_inf = infs;
        st.pad = 0;
        stats[row * n_chunks + c] = st;
    }
    if (!specs[row].need_cands)
        return;

    struct candidate *out = cands + ((size_t)row * n_chunks + c) * SAMPLE_K;
    if (n <= SAMPLE_K) {
        for (int i = threadIdx.x; i < SAMPLE_K; i += blockDim.x) {
            struct candidate cd;
            cd.x = i < n ? canon(x[i]) : -INFINITY;
            cd.id = i < n ? base + i : SAMPLE_NO_ID;
            out[i] = cd;
        }
        return;
    }
    select_best([&](int i) { return key_of(canon(__ldg(&x[i]))); }, n, SAMPLE_K,
                [&](int i, int slot) {
                    struct candidate cd;
                    cd.x = canon(x[i]);
                    cd.id = base + i;
                    out[slot] = cd;
                });
}

/* The row's max M over the chunk stats (every block computes the same). */
static __device__ float row_max(const struct chunk_stat *st, int n_chunks)
{
    float m = -INFINITY;
    for (int c = 0; c < n_chunks; c++)
        m = fmaxf(m, st[c].max);
    return m;
}

static __global__ void __launch_bounds__(SAMPLE_THREADS)
chunk_sums_kernel(const float *logits, int vocab, int chunk, const struct dev_spec *specs,
                  const struct chunk_stat *stats, struct chunk_sum *sums)
{
    int row = blockIdx.y, c = blockIdx.x, n_chunks = gridDim.x;
    const struct dev_spec *sp = &specs[row];
    if (!sp->need_sums)
        return;
    float m = row_max(stats + row * n_chunks, n_chunks);
    int base = c * chunk, n = min(chunk, vocab - base);
    const float *x = logits + (size_t)row * vocab + base;
    double z1 = 0, zt = 0;
    if (m > -INFINITY && m < INFINITY) {
        bool sampling = sp->mode != MODE_GREEDY;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            float v = canon(__ldg(&x[i]));
            z1 += (double)expf(__fsub_rn(v, m));
            if (sampling)
                zt += (double)weight_of(v, m, sp->temperature);
        }
    }
    z1 = block_sum(z1);
    zt = block_sum(zt);
    if (threadIdx.x == 0) {
        sums[row * n_chunks + c].z1 = z1;
        sums[row * n_chunks + c].zt = zt;
    }
}

/* Sum of the row's chunk sums, in chunk order (every block computes the same). */
static __device__ double row_zt(const struct chunk_sum *s, int n_chunks)
{
    double z = 0;
    for (int c = 0; c < n_chunks; c++)
        z += s[c].zt;
    return z;
}

static __global__ void __launch_bounds__(SAMPLE_THREADS)
row_pick_kernel(const float *logits, int vocab, int n_chunks, const struct dev_spec *specs,
                const struct chunk_stat *stats, const struct chunk_sum *sums,
                const struct candidate *cands, struct sample_result *results, int *walk_pending)
{
    int row = blockIdx.x;
    const struct dev_spec *sp = &specs[row];
    const struct chunk_stat *st = stats + row * n_chunks;
    struct sample_result *res = &results[row];
    __shared__ float cx[SAMPLE_K], cp[SAMPLE_K];
    __shared__ int cid[SAMPLE_K];
    __shared__ float m_sh;
    __shared__ double zt_sh;

    if (threadIdx.x == 0) {
        float m = -INFINITY;
        int arg = 0, n_inf = 0;
        for (int c = 0; c < n_chunks; c++) { /* chunk order: the lowest id wins ties */
            if (st[c].max > m) {
                m = st[c].max;
                arg = st[c].argmax;
            }
            n_inf += st[c].n_inf;
        }
        double z1 = 0, zt = 0;
        if (sp->need_sums) {
            for (int c = 0; c < n_chunks; c++)
                z1 += sums[row * n_chunks + c].z1;
            zt = row_zt(sums + row * n_chunks, n_chunks);
        }
        m_sh = m;
        zt_sh = zt;
        res->token = arg;
        res->logit = m > -INFINITY ? m : canon(logits[(size_t)row * vocab]);
        res->max_logit = m;
        res->log_z = m == INFINITY ? logf((float)n_inf)
                     : m > -INFINITY && sp->need_sums ? (float)((double)m + log(z1))
                                                      : -INFINITY;
        res->n_top = 0;
        res->used_random = 0;
        res->need_host = 0;
        res->pad = 0;
        walk_pending[row] = 0;
    }
    __syncthreads();
    float m = m_sh;
    int k_real = min(SAMPLE_K, vocab); /* real candidates; the rest are padding */
    auto swap_c = [&](int i, int j) {
        float tx = cx[i];
        cx[i] = cx[j];
        cx[j] = tx;
        int ti = cid[i];
        cid[i] = cid[j];
        cid[j] = ti;
        float tp = cp[i];
        cp[i] = cp[j];
        cp[j] = tp;
    };

    if (sp->need_cands) {
        /* the SAMPLE_K best by logit over the chunks' lists (which are in id order) */
        const struct candidate *all = cands + (size_t)row * n_chunks * SAMPLE_K;
        int n_all = n_chunks * SAMPLE_K;
        auto key_at = [&](int i) {
            struct candidate cd = all[i];
            return cd.id == SAMPLE_NO_ID ? 0u : key_of(cd.x);
        };
        if (n_all == SAMPLE_K) {
            for (int i = threadIdx.x; i < SAMPLE_K; i += blockDim.x) {
                cx[i] = all[i].x;
                cid[i] = all[i].id;
            }
            __syncthreads();
        } else {
            select_best(key_at, n_all, SAMPLE_K, [&](int i, int slot) {
                cx[slot] = all[i].x;
                cid[slot] = all[i].id;
            });
        }
        /* by logit descending, ties lower id first (padding last) */
        bitonic_sort(SAMPLE_K, [&](int a, int b) {
            return cx[a] > cx[b] || (cx[a] == cx[b] && cid[a] < cid[b]);
        }, swap_c);
        if (threadIdx.x == 0 && sp->n_top > 0) {
            int n_top = min(sp->n_top, k_real);
            for (int k = 0; k < n_top; k++) {
                res->top[k].token = cid[k];
                res->top[k].logit = cx[k];
            }
            res->n_top = n_top;
        }
        __syncthreads();
    }

    if (sp->mode == MODE_GREEDY || !(m > -INFINITY)) /* decided: the argmax, no random number */
        return;
    if (m == INFINITY) {
        if (threadIdx.x == 0)
            res->need_host = 1;
        return;
    }
    if (sp->mode == MODE_WALK) {
        if (threadIdx.x == 0)
            walk_pending[row] = 1;
        return;
    }

    /* Truncation over the candidates, ranked by probability as the host ranks. */
    double zt = zt_sh;
    for (int k = threadIdx.x; k < SAMPLE_K; k += blockDim.x)
        cp[k] = k < k_real ? (float)((double)weight_of(cx[k], m, sp->temperature) / zt) : -1.0f;
    __syncthreads();
    bitonic_sort(SAMPLE_K, [&](int a, int b) {
        return cp[a] > cp[b] || (cp[a] == cp[b] && cid[a] < cid[b]);
    }, swap_c);
    if (threadIdx.x != 0)
        return;
    /* Past the candidates' smallest probability, the host may rank other
     * tokens of that same probability: ids from there on are not known, but
     * the probabilities (hence every count and sum below) are. */
    bool complete = vocab <= SAMPLE_K;
    int trusted = k_real;
    if (!complete)
        for (trusted = 0; trusted < k_real && cp[trusted] > cp[k_real - 1];)
            trusted++;
    long keep = sp->top_k > 0 && sp->top_k < vocab ? sp->top_k : vocab;
    bool known = keep <= k_real;
    if (sp->min_p > 0) {
        float min_prob = sp->min_p * cp[0];
        long limit = keep < k_real ? keep : k_real;
        int k = 1;
        while (k < limit && cp[k] >= min_prob)
            k++;
        if (k < limit || limit == keep) {
            keep = k;
            known = true;
        }
    }
    if (sp->top_p < 1) {
        long limit = keep < k_real ? keep : k_real;
        double cum = 0;
        int k = 0;
        while (k < limit) {
            cum += cp[k++];
            if (cum >= sp->top_p)
                break;
        }
        if (cum >= sp->top_p || known) {
            keep = k;
            known = true;
        }
    }
    if (!known) {
        res->need_host = 1;
        return;
    }
    double total = 0;
    for (int k = 0; k < keep; k++)
        total += cp[k];
    double r = sp->u * total;
    int pick = (int)keep - 1;
    for (int k = 0; k < keep; k++) {
        r -= cp[k];
        if (r < 0) {
            pick = k;
            break;
        }
    }
    if (pick >= trusted) {
        res->need_host = 1;
        return;
    }
    res->token = cid[pick];
    res->logit = cx[pick];
    res->used_random = 1;
}

/* p[i] of plain temperature sampling, as the host normalises it. */
static __device__ __forceinline__ float walk_prob(float x, float m, float t, double zt)
{
    return (float)((double)weight_of(canon(x), m, t) / zt);
}

static __global__ void __launch_bounds__(SAMPLE_THREADS)
walk_sums_kernel(const float *logits, int vocab, int chunk, const struct dev_spec *specs,
                 const struct chunk_stat *stats, const struct chunk_sum *sums,
                 const int *walk_pending, double *walk_sums)
{
    int row = blockIdx.y, c = blockIdx.x, n_chunks = gridDim.x;
    if (!walk_pending[row])
        return;
    const struct dev_spec *sp = &specs[row];
    float m = row_max(stats + row * n_chunks, n_chunks);
    double zt = row_zt(sums + row * n_chunks, n_chunks);
    int base = c * chunk, n = min(chunk, vocab - base);
    const float *x = logits + (size_t)row * vocab + base;
    double s = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        s += walk_prob(__ldg(&x[i]), m, sp->temperature, zt);
    s = block_sum(s);
    if (threadIdx.x == 0)
        walk_sums[row * n_chunks + c] = s;
}

static __global__ void __launch_bounds__(SAMPLE_THREADS)
walk_pick_kernel(const float *logits, int vocab, int chunk, int n_chunks,
                 const struct dev_spec *specs, const struct chunk_stat *stats,
                 const struct chunk_sum *sums, const int *walk_pending, const double *walk_sums,
                 struct sample_result *results)
{
    int row = blockIdx.x;
    if (!walk_pending[row])
        return;
    const struct dev_spec *sp = &specs[row];
    const double *ws = walk_sums + row * n_chunks;
    __shared__ int chunk_sh, found_sh;
    __shared__ double r_sh;
    if (threadIdx.x == 0) {
        double total = 0;
        for (int c = 0; c < n_chunks; c++)
            total += ws[c];
        double r = sp->u * total, before = 0;
        int c = 0;
        while (c < n_chunks && !(r < before + ws[c]))
            before += ws[c++];
        chunk_sh = c;
        r_sh = r - before;
        found_sh = INT32_MAX;
    }
    __syncthreads();
    const float *x = logits + (size_t)row * vocab;
    int token;
    if (chunk_sh == n_chunks) {
        token = vocab - 1; /* rounding never let r drop below 0: the host's last candidate */
    } else {
        float m = row_max(stats + row * n_chunks, n_chunks);
        double zt = row_zt(sums + row * n_chunks, n_chunks);
        int base = chunk_sh * chunk, n = min(chunk, vocab - base);
        int per = (n + blockDim.x - 1) / blockDim.x;
        int lo = threadIdx.x * per, hi = min(n, lo + per);
        double seg = 0;
        for (int i = lo; i < hi; i++)
            seg += walk_prob(x[base + i], m, sp->temperature, zt);
        double total;
        double run = block_exclusive_scan(seg, &total);
        double r = r_sh;
        if (r < run + seg)
            for (int i = lo; i < hi; i++) {
                run += walk_prob(x[base + i], m, sp->temperature, zt);
                if (r < run) {
                    atomicMin(&found_sh, i);
                    break;
                }
            }
        __syncthreads();
        token = base + (found_sh == INT32_MAX ? n - 1 : found_sh);
    }
    if (threadIdx.x == 0) {
        results[row].token = token;
        results[row].logit = canon(x[token]);
        results[row].used_random = 1;
    }
}

/* ---- host side ------------------------------------------------------------ */

cudaError_t cu_sampler_create(struct cu_sampler **out)
{
    *out = (struct cu_sampler *)calloc(1, sizeof **out);
    return *out ? cudaSuccess : cudaErrorMemoryAllocation;
}

static void free_partials(struct cu_sampler *sp)
{
    cudaFree(sp->stats);
    cudaFree(sp->sums);
    cudaFree(sp->walk_sums);
    cudaFree(sp->cands);
    sp->stats = NULL;
    sp->sums = NULL;
    sp->walk_sums = NULL;
    sp->cands = NULL;
    sp->part_cap = 0;
}

static void free_rows(struct cu_sampler *sp)
{
    cudaFree(sp->results);
    cudaFree(sp->walk_pending);
    cudaFreeHost(sp->results_host);
    sp->results = NULL;
    sp->walk_pending = NULL;
    sp->results_host = NULL;
    sp->rows_cap = 0;
}

void cu_sampler_destroy(struct cu_sampler *sp)
{
    if (!sp)
        return;
    free_partials(sp);
    free_rows(sp);
    cudaFreeHost(sp->staging);
    cudaFree(sp->params);
    free(sp);
}

static cudaError_t ensure_room(struct cu_sampler *sp, int n_rows, int n_chunks, size_t param_bytes)
{
    cudaError_t e = cudaSuccess;
    if (param_bytes > sp->staging_cap) {
        cudaFreeHost(sp->staging);
        cudaFree(sp->params);
        sp->staging = NULL;
        sp->params = NULL;
        sp->staging_cap = 0;
        size_t cap = 4096;
        while (cap < param_bytes)
            cap *= 2;
        if ((e = cudaMallocHost((void **)&sp->staging, cap)) != cudaSuccess ||
            (e = cudaMalloc((void **)&sp->params, cap)) != cudaSuccess)
            return e;
        sp->staging_cap = cap;
    }
    if (n_rows > sp->rows_cap) {
        free_rows(sp);
        int cap = n_rows < 16 ? 16 : n_rows;
        if ((e = cudaMalloc((void **)&sp->results, cap * sizeof *sp->results)) != cudaSuccess ||
            (e = cudaMalloc((void **)&sp->walk_pending, cap * sizeof *sp->walk_pending)) != cudaSuccess ||
            (e = cudaMallocHost((void **)&sp->results_host, cap * sizeof *sp->results_host)) != cudaSuccess)
            return e;
        sp->rows_cap = cap;
    }
    int parts = n_rows * n_chunks;
    if (parts > sp->part_cap) {
        free_partials(sp);
        int cap = parts < 16 * SAMPLE_MAX_CHUNKS ? 16 * SAMPLE_MAX_CHUNKS : parts;
        if ((e = cudaMalloc((void **)&sp->stats, cap * sizeof *sp->stats)) != cudaSuccess ||
            (e = cudaMalloc((void **)&sp->sums, cap * sizeof *sp->sums)) != cudaSuccess ||
            (e = cudaMalloc((void **)&sp->walk_sums, cap * sizeof *sp->walk_sums)) != cudaSuccess ||
            (e = cudaMalloc((void **)&sp->cands, (size_t)cap * SAMPLE_K * sizeof *sp->cands)) != cudaSuccess)
            return e;
        sp->part_cap = cap;
    }
    return cudaSuccess;
}

/* The kernels' view of a spec, with what the row needs computed. */
static struct dev_spec dev_spec_of(const struct sample_spec *s, int vocab)
{
    struct dev_spec d;
    memset(&d, 0, sizeof d);
    d.u = s->u;
    d.temperature = s->temperature;
    d.top_p = s->top_p;
    d.min_p = s->min_p;
    d.rep = s->repetition_penalty;
    d.presence = s->presence_penalty;
    d.frequency = s->frequency_penalty;
    d.top_k = s->top_k;
    d.n_top = s->n_top < 0 ? -1 : s->n_top > SAMPLE_MAX_TOP ? SAMPLE_MAX_TOP : s->n_top;
    bool greedy = s->temperature == 0.0f || s->top_k == 1;
    bool truncates = (s->top_k > 0 && s->top_k < vocab) || s->min_p > 0 || s->top_p < 1;
    d.mode = greedy ? MODE_GREEDY : truncates ? MODE_TRUNCATE : MODE_WALK;
    d.need_sums = !greedy || d.n_top >= 0;
    d.need_cands = d.mode == MODE_TRUNCATE || d.n_top > 0;
    d.mask_row = -1;
    return d;
}

cudaError_t cu_sampler_run(struct cu_sampler *sp, cudaStream_t stream, float *logits, int n_rows,
                           int vocab, const struct sample_spec *specs, struct sample_result *out,
                           float *host_rows, const char **what)
{
    if (n_rows <= 0)
        return cudaSuccess;
    int chunk = (vocab + SAMPLE_MAX_CHUNKS - 1) / SAMPLE_MAX_CHUNKS;
    chunk = (chunk + SAMPLE_THREADS - 1) / SAMPLE_THREADS * SAMPLE_THREADS;
    if (chunk < SAMPLE_MIN_CHUNK)
        chunk = SAMPLE_MIN_CHUNK;
    int n_chunks = (vocab + chunk - 1) / chunk;

    long n_adj = 0;
    int n_masks = 0, words = (vocab + 31) / 32;
    for (int r = 0; r < n_rows; r++) {
        n_adj += specs[r].n_adjust > 0 ? specs[r].n_adjust : 0;
        n_masks += specs[r].mask != NULL;
    }
    size_t spec_bytes = (size_t)n_rows * sizeof(struct dev_spec);
    size_t mask_bytes = (size_t)n_masks * (size_t)words * sizeof(uint32_t);
    size_t param_bytes = spec_bytes + (size_t)n_adj * sizeof(struct dev_adjust) + mask_bytes;
    *what = "allocating sampling buffers";
    cudaError_t e = ensure_room(sp, n_rows, n_chunks, param_bytes);
    if (e != cudaSuccess)
        return e;

    struct dev_spec *ds = (struct dev_spec *)sp->staging;
    struct dev_adjust *da = (struct dev_adjust *)(sp->staging + spec_bytes);
    bool any_sums = false, any_walk = false;
    long a = 0;
    for (int r = 0; r < n_rows; r++) {
        ds[r] = dev_spec_of(&specs[r], vocab);
        any_sums |= ds[r].need_sums != 0;
        any_walk |= ds[r].mode == MODE_WALK;
        for (int i = 0; i < specs[r].n_adjust; i++) {
            const struct sample_adjust *s = &specs[r].adjust[i];
            if (s->token < 0 || s->token >= vocab)
                continue;
            da[a].row = r;
            da[a].token = s->token;
            da[a].count = s->count;
            da[a].repeat = s->repeat;
            da[a].bias = s->bias;
            a++;
        }
    }
    /* The masks after the adjustments actually kept, one bitset per masked row. */
    size_t mask_off = spec_bytes + (size_t)a * sizeof *da;
    uint32_t *dm = (uint32_t *)(sp->staging + mask_off);
    int m = 0;
    for (int r = 0; r < n_rows; r++)
        if (specs[r].mask) {
            memcpy(dm + (size_t)m * words, specs[r].mask, (size_t)words * sizeof *dm);
            ds[r].mask_row = m++;
        }
    const struct dev_spec *dspec = (const struct dev_spec *)sp->params;
    const struct dev_adjust *dadj = (const struct dev_adjust *)(sp->params + spec_bytes);
    const uint32_t *dmasks = (const uint32_t *)(sp->params + mask_off);

    *what = "uploading sampling parameters";
    if ((e = cudaMemcpyAsync(sp->params, sp->staging, mask_off + (size_t)m * words * sizeof *dm,
                             cudaMemcpyHostToDevice, stream)) != cudaSuccess)
        return e;
    *what = "the sampling kernels";
    if (a > 0)
        adjust_kernel<<<(unsigned)((a + 255) / 256), 256, 0, stream>>>(logits, vocab, dspec, dadj,
                                                                       (int)a);
    if (m > 0) {
        dim3 mgrid((unsigned)((vocab + 255) / 256), (unsigned)n_rows);
        mask_kernel<<<mgrid, 256, 0, stream>>>(logits, vocab, dspec, dmasks, words);
    }
    dim3 grid(n_chunks, n_rows);
    chunk_stats_kernel<<<grid, SAMPLE_THREADS, 0, stream>>>(logits, vocab, chunk, dspec,
                                                            sp->stats, sp->cands);
    if (any_sums)
        chunk_sums_kernel<<<grid, SAMPLE_THREADS, 0, stream>>>(logits, vocab, chunk, dspec,
                                                               sp->stats, sp->sums);
    row_pick_kernel<<<n_rows, SAMPLE_THREADS, 0, stream>>>(logits, vocab, n_chunks, dspec,
                                                           sp->stats, sp->sums, sp->cands,
                                                           sp->results, sp->walk_pending);
    if (any_walk) {
        walk_sums_kernel<<<grid, SAMPLE_THREADS, 0, stream>>>(logits, vocab, chunk, dspec,
                                                              sp->stats, sp->sums,
                                                              sp->walk_pending, sp->walk_sums);
        walk_pick_kernel<<<n_rows, SAMPLE_THREADS, 0, stream>>>(logits, vocab, chunk, n_chunks,
                                                                dspec, sp->stats, sp->sums,
                                                                sp->walk_pending, sp->walk_sums,
                                                                sp->results);
    }
    if ((e = cudaGetLastError()) != cudaSuccess)
        return e;
    *what = "copying sampling results";
    if ((e = cudaMemcpyAsync(sp->results_host, sp->results, (size_t)n_rows * sizeof *out,
                             cudaMemcpyDeviceToHost, stream)) != cudaSuccess ||
        (e = cudaStreamSynchronize(stream)) != cudaSuccess)
        return e;
    memcpy(out, sp->results_host, (size_t)n_rows * sizeof *out);
    *what = "copying a row the host samples";
    bool copied = false;
    for (int r = 0; r < n_rows; r++)
        if (out[r].need_host) {
            size_t row = (size_t)r * vocab;
            if ((e = cudaMemcpyAsync(host_rows + row, logits + row, (size_t)vocab * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream)) != cudaSuccess)
                return e;
            copied = true;
        }
    if (copied && (e = cudaStreamSynchronize(stream)) != cudaSuccess)
        return e;
    return cudaSuccess;
}
