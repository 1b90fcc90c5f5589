/* base/panels.h — BF16 weights in panels of 32 rows (DTYPE_BF16_P32): packing a row-major matrix and reading an element back.
 *
 * Panel p holds rows 32 p .. 32 p + 31. For column pair j (columns 2 j and
 * 2 j + 1) it holds 32 words of 32 bits, one per row, the even column in the
 * low half: rows 0-15's words, then rows 16-31's. A pair is one 64-byte
 * vector per 16 rows, what vdpbf16ps multiplies by a broadcast pair of x, so
 * a GEMV over panels sums each output in one lane, and the GEMM copies a
 * panel's K block as its packed W. Rows past the matrix and an odd K's last
 * column are zero. */
#ifndef INFERD_BASE_PANELS_H
#define INFERD_BASE_PANELS_H

#include <stdint.h>
#include <string.h>

#define PANEL_ROWS 32

static inline int64_t panels_pairs(int64_t cols) { return (cols + 1) / 2; }

/* Bytes of a rows x cols matrix in panels. */
static inline uint64_t panels_bytes(int64_t rows, int64_t cols)
{
    return (uint64_t)((rows + PANEL_ROWS - 1) / PANEL_ROWS) * PANEL_ROWS *
           (uint64_t)panels_pairs(cols) * 4;
}

/* The 16-bit index of element (r, c) in a matrix of cols columns in panels. */
static inline uint64_t panels_index(int64_t cols, int64_t r, int64_t c)
{
    uint64_t word = ((uint64_t)(r / PANEL_ROWS) * (uint64_t)panels_pairs(cols) + (uint64_t)(c / 2)) *
                        PANEL_ROWS +
                    (uint64_t)(r % PANEL_ROWS);
    return 2 * word + (uint64_t)(c % 2);
}

/* Row r's column pairs in a matrix of cols columns in panels: pair j (its even column in the
 * low half) is the word at [j * PANEL_ROWS]. */
static inline const uint32_t *panels_row_pairs(const uint16_t *panels, int64_t cols, int64_t r)
{
    return (const uint32_t *)(const void *)panels +
           (uint64_t)(r / PANEL_ROWS) * (uint64_t)panels_pairs(cols) * PANEL_ROWS +
           (uint64_t)(r % PANEL_ROWS);
}

/* dst (panels_bytes(rows, cols), zeroed here where padding) := src, rows x
 * cols BF16 row-major. */
static inline void panels_pack(const uint16_t *src, int64_t rows, int64_t cols, uint16_t *dst)
{
    int64_t pairs = panels_pairs(cols), n_panels = (rows + PANEL_ROWS - 1) / PANEL_ROWS;
    for (int64_t p = 0; p < n_panels; p++) {
        uint16_t *panel = dst + (uint64_t)p * (uint64_t)pairs * PANEL_ROWS * 2;
        for (int i = 0; i < PANEL_ROWS; i++) {
            int64_t r = p * PANEL_ROWS + i;
            const uint16_t *row = src + (uint64_t)r * (uint64_t)cols;
            for (int64_t j = 0; j < pairs; j++) {
                uint16_t lo = 0, hi = 0;
                if (r < rows) {
                    lo = row[2 * j];
                    hi = 2 * j + 1 < cols ? row[2 * j + 1] : 0;
                }
                uint16_t *at = panel + 2 * ((uint64_t)j * PANEL_ROWS + (uint64_t)i);
                at[0] = (uint16_t)lo;
                at[1] = (uint16_t)hi;
            }
        }
    }
}

/* dst (n x cols BF16, row-major) := rows [r0, r0 + n) of a matrix of cols
 * columns in panels: panels_pack's inverse. */
static inline void panels_unpack_rows(const uint16_t *panels, int64_t cols, int64_t r0, int64_t n,
                                      uint16_t *dst)
{
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < cols; c++)
            dst[(uint64_t)r * (uint64_t)cols + (uint64_t)c] = panels[panels_index(cols, r0 + r, c)];
}

#endif
