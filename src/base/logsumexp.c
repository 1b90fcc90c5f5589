/* base/logsumexp.c — log(sum e^x) over a float vector with a vectorized exponential. */
#include "base/logsumexp.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Eight floats or ints (GCC's vector extensions: AVX2 registers at our baseline ISA). */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

#define SPLAT(x) {x, x, x, x, x, x, x, x}
/* Terms summed in float lanes before the lanes' sums are added in double. */
#define LSE_BLOCK 1024

/* a where mask (all ones), b where not (all zeros). */
static inline v8f select(v8i mask, v8f a, v8f b)
{
    v8i ai, bi;
    memcpy(&ai, &a, sizeof ai);
    memcpy(&bi, &b, sizeof bi);
    v8i r = (ai & mask) | (bi & ~mask);
    v8f out;
    memcpy(&out, &r, sizeof out);
    return out;
}

/* e^y for y <= 0: y = k ln2 + r with |r| <= ln2 / 2, e^r by its Taylor polynomial to r^7
 * (error under 2e-8 there), times 2^k built in the exponent bits. Below -87 (where 2^k
 * leaves the normal range) the result is 0; -INFINITY gives 0. */
static inline v8f exp_nonpositive(v8f y)
{
    const v8f lo = SPLAT(-87.0f), round = SPLAT(12582912.0f); /* 1.5 * 2^23 rounds */
    const v8f log2e = SPLAT(1.44269504088896341f);
    const v8f ln2_hi = SPLAT(0.693145751953125f), ln2_lo = SPLAT(1.42860682030941723e-6f);
    v8i keep = y >= lo;
    y = select(keep, y, lo);
    v8f k = (y * log2e + round) - round;
    v8f r = y - k * ln2_hi; /* exact: ln2_hi has few bits */
    r = r - k * ln2_lo;
    v8f p = SPLAT(1.0f / 5040.0f);
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    v8i bits = (__builtin_convertvector(k, v8i) + 127) << 23;
    v8f scale;
    memcpy(&scale, &bits, sizeof scale);
    return select(keep, p * scale, (v8f)SPLAT(0.0f));
}

double logsumexp_f32(const float *x, size_t n)
{
    v8f m8 = SPLAT(-INFINITY);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f v;
        memcpy(&v, x + i, sizeof v);
        m8 = select(v > m8, v, m8);
    }
    float mx = -INFINITY;
    for (int j = 0; j < 8; j++)
        mx = m8[j] > mx ? m8[j] : mx;
    for (size_t t = i; t < n; t++)
        mx = x[t] > mx ? x[t] : mx;
    if (mx == -INFINITY)
        return -INFINITY;
    const v8f m = SPLAT(mx);
    /* a float lane adds at most LSE_BLOCK / 8 terms before its sum moves to
     * double: once a lane holds a strong logit's e^0 = 1, terms below half
     * its float step (3e-8) vanish; one chain per lane over a 152k row with a
     * strong candidate above a wide background lost 1.7e-4 of the log */
    double s = 0;
    for (i = 0; i + 8 <= n;) {
        v8f s8 = SPLAT(0.0f);
        size_t end = n - i > LSE_BLOCK ? i + LSE_BLOCK : n;
        for (; i + 8 <= end; i += 8) {
            v8f v;
            memcpy(&v, x + i, sizeof v);
            s8 += exp_nonpositive(v - m);
        }
        for (int j = 0; j < 8; j++)
            s += s8[j];
    }
    v8f tail = SPLAT(-INFINITY);
    for (size_t t = i; t < n; t++)
        tail[t - i] = x[t];
    v8f t8 = exp_nonpositive(tail - m);
    for (int j = 0; j < 8; j++)
        s += t8[j];
    return mx + log(s);
}
