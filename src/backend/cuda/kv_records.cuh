/* backend/cuda/kv_records.cuh — a quantized KV cache's records (backend/kv_quant.h) in shared memory, as the tensor-core attention kernels take them: copied by a warp with cp.async, DQ_ROWS positions at a time, and decoded there into fp16 tiles (fa_mma.cuh's swizzled rows). */
#ifndef INFERD_BACKEND_CUDA_KV_RECORDS_CUH
#define INFERD_BACKEND_CUDA_KV_RECORDS_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#include "backend/cuda/fa_mma.cuh"
#include "backend/cuda/record.h"
#include "backend/cuda/warp.cuh"
#include "backend/kv_quant.h"

/* Decoding, 8 elements a lane at a time (whole bytes of codes): affine
 * codes become fp16 through their bits under 1024's exponent, less 1024
 * (exact), then one fused scale * code + bias in fp16, whose operands are
 * the record's own f16 scale and bias, so each element is rounded once;
 * TURBO codes are looked up in the block's fp16 copy of the Lloyd–Max
 * levels (a pair of codes at a time for widths up to 4 bits) and scaled by
 * the record's f16 norm. QJL keys are not read here. */
#define DQ_ROWS 16          /* records a warp copies, or decodes, at a time */
#define DQ_TABLE_BYTES 1024 /* one side's TURBO levels in fp16 */
#define DQ_NO_SLOT 0xffffffffu

/* One side (K or V) of a kv head's records in one layer. */
struct dq_side {
    const uint8_t *base; /* the 16-byte chunk where the head's record starts, slot 0 of block 0 */
    uint32_t row_bytes;  /* a slot's row: every kv head's record */
    int lead;            /* bytes of that chunk before the record */
    int chunks;          /* 16-byte chunks copied per record */
    int bits;            /* per code */
    bool turbo;
    int code_off;    /* bytes before the codes: TURBO's norm */
    int pair_off;    /* AFFINE: bytes before the (scale, bias) pairs */
    int group_shift; /* AFFINE: the 8 dims of chunk c share pair c >> group_shift */
};

/* Room for one record of `bytes` in a sub-tile, whatever its lead. */
static constexpr __host__ __device__ int dq_record_room(int bytes)
{
    return 16 * ((bytes + 15) / 16 + (bytes % 16 != 0));
}

static __device__ __forceinline__ dq_side dq_side_of(const struct cu_kv &kv, int layer, int h,
                                                     int hd, bool v)
{
    const struct kv_quant_layer &f = kv.fmt;
    const int bytes = kvq_head_bytes(&f, hd, v);
    const size_t at = (size_t)h * bytes;
    dq_side s;
    s.row_bytes = v ? kv.v_row_bytes : kv.k_row_bytes;
    s.base = (const uint8_t *)(v ? kv.v : kv.k) +
             (size_t)layer * kv.n_blocks * kv.block_size * s.row_bytes + (at & ~(size_t)15);
    s.lead = (int)(at & 15);
    s.chunks = (s.lead + bytes + 15) / 16;
    s.bits = kvq_code_bits(&f, v);
    s.turbo = f.scheme == KV_QUANT_TURBO;
    s.code_off = s.turbo ? 2 : 0;
    s.pair_off = hd * s.bits / 8;
    s.group_shift = s.turbo ? 0 : __ffs(f.group_size / 8) - 1;
    return s;
}

/* A side's Lloyd–Max levels as fp16 in tab: pairs (level of the low code,
 * level of the high one) indexed by two codes for widths up to 4 bits,
 * single levels otherwise. By the block's threads. */
static __device__ __forceinline__ void dq_levels(const struct cu_kv &kv, int bits, uint8_t *tab)
{
    const float *lv = kv.cb->levels[bits];
    const int mask = (1 << bits) - 1;
    if (bits <= 4) {
        for (int i = threadIdx.x; i < 1 << (2 * bits); i += blockDim.x)
            ((__half2 *)tab)[i] = __floats2half2_rn(lv[i & mask], lv[i >> bits]);
    } else {
        for (int i = threadIdx.x; i <= mask; i += blockDim.x)
            ((__half *)tab)[i] = __float2half_rn(lv[i]);
    }
}

/* B bytes from shared memory: the first four in lo, the rest in hi. At any
 * alignment unless aligned (p a multiple of 8, or of 4 for B = 4); the
 * words after them may be read. */
template <int B>
static __device__ __forceinline__ void dq_bytes(const uint8_t *p, bool aligned, uint32_t &lo,
                                                uint32_t &hi)
{
    if (aligned && B == 8) {
        const uint2 v = *(const uint2 *)p;
        lo = v.x, hi = v.y;
        return;
    }
    if (aligned && B == 4) {
        lo = *(const uint32_t *)p, hi = 0u;
        return;
    }
    const uintptr_t a = (uintptr_t)p;
    const uint32_t *w = (const uint32_t *)(a & ~(uintptr_t)3);
    const uint32_t sh = 8u * (uint32_t)(a & 3);
    const uint32_t w0 = w[0], w1 = w[1];
    lo = __funnelshift_r(w0, w1, sh);
    hi = B > 4 ? __funnelshift_r(w1, w[2], sh) : 0u;
}

static __device__ __forceinline__ __half2 dq_h2(uint32_t v)
{
    return *(__half2 *)&v;
}

static __device__ __forceinline__ uint32_t dq_u32(__half2 v)
{
    return *(uint32_t *)&v;
}

/* Two byte codes (bytes i and j of x) as fp16 pair scale * code + bias. */
static __device__ __forceinline__ uint32_t dq_affine_pair(uint32_t x, uint32_t sel, __half2 s,
                                                          __half2 b)
{
    /* code c as the fp16 bits 0x6400 | c = 1024 + c, less 1024: exact */
    const __half2 c = __hsub2(dq_h2(__byte_perm(x, 0x64646464u, sel)),
                              __float2half2_rn(1024.0f));
    return dq_u32(__hfma2(c, s, b));
}

/* Elements 8 c .. 8 c + 7 of a record from its B bytes of codes (lo, hi). */
template <int B, bool TURBO>
static __device__ __forceinline__ uint4 dq_chunk(uint32_t lo, uint32_t hi, const uint8_t *rec,
                                                 const dq_side &sd, int c, const uint8_t *tab)
{
    uint4 out;
    if (!TURBO) {
        if (B == 4) { /* nibbles to one code a byte */
            const uint32_t e = lo & 0x0f0f0f0fu, o = (lo >> 4) & 0x0f0f0f0fu;
            lo = __byte_perm(e, o, 0x5140);
            hi = __byte_perm(e, o, 0x7362);
        }
        const uint32_t pair =
            *(const uint32_t *)(rec + sd.pair_off + ((c >> sd.group_shift) << 2));
        const __half2 s = dq_h2(__byte_perm(pair, 0, 0x1010)), b = dq_h2(__byte_perm(pair, 0, 0x3232));
        out.x = dq_affine_pair(lo, 0x4140, s, b);
        out.y = dq_affine_pair(lo, 0x4342, s, b);
        out.z = dq_affine_pair(hi, 0x4140, s, b);
        out.w = dq_affine_pair(hi, 0x4342, s, b);
        return out;
    }
    const uint32_t nb = *(const unsigned short *)rec;
    const __half2 norm = dq_h2(nb | nb << 16);
    uint32_t v[4];
    if (B <= 4) {
        const uint32_t *pairs = (const uint32_t *)tab;
#pragma unroll
        for (int k = 0; k < 4; k++)
            v[k] = dq_u32(__hmul2(dq_h2(pairs[(lo >> (2 * B * k)) & ((1u << 2 * B) - 1)]), norm));
    } else {
        const unsigned short *one = (const unsigned short *)tab;
        const uint64_t x = (uint64_t)hi << 32 | lo;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint32_t a = one[(uint32_t)(x >> (B * 2 * k)) & ((1u << B) - 1)];
            const uint32_t b = one[(uint32_t)(x >> (B * (2 * k + 1))) & ((1u << B) - 1)];
            v[k] = dq_u32(__hmul2(dq_h2(a | b << 16), norm));
        }
    }
    out.x = v[0], out.y = v[1], out.z = v[2], out.w = v[3];
    return out;
}

/* A warp's DQ_ROWS records of one side (raw, stride bytes apart) into an
 * fp16 sub-tile at dst, a 16-byte chunk of 8 elements a lane at a time,
 * UNROLL chunks' loads issued together. Rows of HD halves with their chunks
 * swizzled as swz says, or with WG as wgmma reads them: HD / 64 tiles of
 * FA_BK rows of 128 bytes (wgmma_swz), dst the sub-tile's first row in the
 * first. */
template <int HD, int B, bool TURBO, int UNROLL, bool WG>
static __device__ __forceinline__ void dq_decode_b(const uint8_t *raw, int stride,
                                                   const dq_side &sd, const uint8_t *tab,
                                                   uint32_t dst, int lane)
{
    constexpr int CPR = HD / 8, RPI = 32 / CPR;
    constexpr int PITCH = WG ? 128 : HD * 2; /* bytes from a row to the next */
    const int c = lane % CPR, r0 = lane / CPR;
    /* records start at the same offset in every room (rooms are multiples
     * of 16 bytes) */
    const bool aligned = ((sd.lead + sd.code_off) & (B == 8 ? 7 : 3)) == 0;
    const uint8_t *rec0 = raw + r0 * stride + sd.lead;
    /* row r0 + i RPI's swizzled chunk: r0 < RPI shares no bit with i RPI, so
     * its chunk bits are row r0's XOR (i RPI) & 7 */
    const uint32_t at0 =
        dst + (uint32_t)(r0 * PITCH) + (WG ? (uint32_t)((c >> 3) * FA_BK * 128) : 0u);
    const uint32_t chunk0 = (uint32_t)((WG ? c & 7 : c) ^ (r0 & 7));
#pragma unroll UNROLL
    for (int i = 0; i < DQ_ROWS / RPI; i++) {
        const uint8_t *rec = rec0 + i * RPI * stride;
        uint32_t lo, hi;
        dq_bytes<B>(rec + sd.code_off + c * B, aligned, lo, hi);
        const uint4 x = dq_chunk<B, TURBO>(lo, hi, rec, sd, c, tab);
        const uint32_t at = at0 + (uint32_t)(i * RPI * PITCH) +
                            ((chunk0 ^ (uint32_t)((i * RPI) & 7)) << 4);
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(at), "r"(x.x),
                     "r"(x.y), "r"(x.z), "r"(x.w));
    }
}

template <int HD, int UNROLL = 2, bool WG = false>
static __device__ __forceinline__ void dq_decode(const uint8_t *raw, int stride,
                                                 const dq_side &sd, const uint8_t *tab,
                                                 uint32_t dst, int lane)
{
    if (!sd.turbo) {
        if (sd.bits == 4)
            dq_decode_b<HD, 4, false, UNROLL, WG>(raw, stride, sd, tab, dst, lane);
        else
            dq_decode_b<HD, 8, false, UNROLL, WG>(raw, stride, sd, tab, dst, lane);
        return;
    }
    switch (sd.bits) {
    case 2: dq_decode_b<HD, 2, true, UNROLL, WG>(raw, stride, sd, tab, dst, lane); break;
    case 3: dq_decode_b<HD, 3, true, UNROLL, WG>(raw, stride, sd, tab, dst, lane); break;
    case 4: dq_decode_b<HD, 4, true, UNROLL, WG>(raw, stride, sd, tab, dst, lane); break;
    case 5: dq_decode_b<HD, 5, true, UNROLL, WG>(raw, stride, sd, tab, dst, lane); break;
    default: dq_decode_b<HD, 8, true, UNROLL, WG>(raw, stride, sd, tab, dst, lane); break;
    }
}

/* A warp's copies of the records of DQ_ROWS positions at a time into one of
 * `stages` rooms (K's records, then V's, each record at the same lead as in
 * the cache). Each pass
 * copies the records of one position (two when a position's K and V chunks
 * fit 16 lanes), a lane per 16-byte chunk, K's chunks then V's, so a
 * record's chunks are read side by side. */
struct dq_stream {
    dq_side k, v;
    const uint32_t *bt;
    int block_size, last;
    uint32_t raw0;          /* shared address of stage 0 */
    int kroom, vroom;       /* bytes a record takes in a sub-tile */
    int stages;
    uint32_t stage_bytes;   /* DQ_ROWS records of each side */
    /* this lane's part of a pass */
    int per_pass, pos_in_pass;
    bool copies, of_v;
    uint32_t dst_off, src_off; /* its chunk's offset in a record's room and in the record's row */

    __device__ __forceinline__ void init(const dq_side &k_, const dq_side &v_,
                                         const uint32_t *bt_, int block_size_, int last_,
                                         uint32_t raw0_, int kroom_, int vroom_, int stages_,
                                         int lane)
    {
        k = k_, v = v_, bt = bt_, block_size = block_size_, last = last_;
        raw0 = raw0_, kroom = kroom_, vroom = vroom_, stages = stages_;
        stage_bytes = (uint32_t)(DQ_ROWS * (kroom + vroom));
        const int lanes = k.chunks + v.chunks <= 16 ? 16 : 32;
        per_pass = 32 / lanes;
        pos_in_pass = lane / lanes;
        const int ci = lane % lanes;
        copies = ci < k.chunks + v.chunks;
        of_v = ci >= k.chunks;
        const int chunk = of_v ? ci - k.chunks : ci;
        dst_off = (of_v ? DQ_ROWS * kroom : 0) + 16 * chunk;
        src_off = 16 * chunk;
    }

    /* A warp's walk over its sub-tiles at w_first, w_first + FA_BK, ... (n
     * of them), STAGES - 1 copies ahead: prime() issues the first copies,
     * each its own commit group; then for each j in turn, arrive(j) waits
     * for sub-tile j's records, issues the copy STAGES - 1 sub-tiles ahead
     * and returns the offset of sub-tile j's stage from the first. */
    template <int STAGES>
    __device__ __forceinline__ void prime(int w_first, int n, int lane) const
    {
        for (int j = 0; j < STAGES - 1; j++) {
            if (j < n)
                copy(w_first + j * FA_BK, j, lane);
            cp_async_commit();
        }
    }

    template <int STAGES>
    __device__ __forceinline__ uint32_t arrive(int j, int w_first, int n, int lane) const
    {
        cp_async_wait<STAGES - 2>();
        __syncwarp(); /* sub-tile j is in; j - 1's buffers are free */
        if (j + STAGES - 1 < n)
            copy(w_first + (j + STAGES - 1) * FA_BK, j + STAGES - 1, lane);
        cp_async_commit();
        return (uint32_t)(j % STAGES) * stage_bytes;
    }

    /* Issues the copies of positions p0 .. p0 + DQ_ROWS - 1 into stage
     * j % stages (positions past last are zero-filled). */
    __device__ __forceinline__ void copy(int p0, int j, int lane) const
    {
        uint32_t slot = DQ_NO_SLOT;
        const int p = p0 + lane;
        if (lane < DQ_ROWS && p <= last) {
            const uint32_t blk = __ldg(bt + p / block_size);
            slot = blk * (uint32_t)block_size + (uint32_t)(p % block_size);
        }
        const uint32_t dst = raw0 + (uint32_t)(j % stages) * stage_bytes + dst_off;
        const uint8_t *src = (of_v ? v.base : k.base) + src_off;
        const uint32_t row_bytes = of_v ? v.row_bytes : k.row_bytes;
        const int room = of_v ? vroom : kroom;
        for (int i = 0; i < DQ_ROWS / per_pass; i++) {
            const int r = i * per_pass + pos_in_pass;
            const uint32_t s = __shfl_sync(0xffffffffu, slot, r);
            if (copies)
                cp_async16(dst + (uint32_t)(r * room),
                           src + (s == DQ_NO_SLOT ? 0 : (size_t)s * row_bytes), s != DQ_NO_SLOT);
        }
    }
};

#endif
