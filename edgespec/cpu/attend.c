/* Fused attention for MLX's CPU backend (edgespec/cpu/fused.py builds and loads it): the query
   rows of a one-token step, a verify or a piece of a prompt chunk (a few tokens a call) against a
   long KV cache, in one pass over the keys and one over the values, with the query heads that
   share a KV head read together.

   Each query row is computed alone, in an order fixed by its key indices: a key's score is the
   same sum whatever block or forward it is part of, the softmax's sum keeps one running sum per
   key index modulo 16 and the values' sum one per key index modulo 2. So a verify's row, which
   sees keys j < limit, carries the bits of the one-token step over those keys, and a key hidden
   by a mask adds an exact zero, as a key past the limit does (a chain-shaped tree's rows keep the
   chain's bits). */
#include <stdint.h>
#include <string.h>

typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef float vfu __attribute__((vector_size(64), aligned(4)));
#define LD(p) (*(const vfu *)(p))
#define ST(p, x) (*(vfu *)(p) = (x))
#if defined(__clang__) || (__GNUC__ >= 12 && !defined(ATTEND_GCC_SHUFFLE))
#define SH __builtin_shufflevector
#else /* GCC before 12 has only its own shuffle (the tests build both ways with GCC 12) */
#define SH(a, b, ...) __builtin_shuffle(a, b, (vi){__VA_ARGS__})
#endif
#define BLK 64 /* keys per block of the values' pass */

/* lane w of the result: the sum of t[w]'s 16 lanes (a fixed tree, whatever the other t are) */
static inline vf reduce16(const vf *t) {
    vf u[8], v[4], w[2];
    for (int i = 0; i < 8; i++)
        u[i] = SH(t[2 * i], t[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               SH(t[2 * i], t[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30,
                  31);
    for (int i = 0; i < 4; i++)
        v[i] = SH(u[2 * i], u[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26,
                  27) +
               SH(u[2 * i], u[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30,
                  31);
    for (int i = 0; i < 2; i++)
        w[i] = SH(v[2 * i], v[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28,
                  29) +
               SH(v[2 * i], v[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30,
                  31);
    return SH(w[0], w[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
           SH(w[0], w[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

static inline float lanes_total(vf x) {
    vf a = SH(x, x, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7) +
           SH(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15);
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

static inline vf vexp(vf x) { /* e^x for x <= 0 (Cephes' polynomial), 0 < result <= 1 */
    const vf lo = (vf){} - 87.0f;
    vi under = x < lo;
    x = (vf)(((vi)x & ~under) | ((vi)lo & under));
    vf t = x * 1.44269504088896341f + 12582912.0f;
    vf m = t - 12582912.0f;
    vf r = x - m * 0.693359375f;
    r = r + m * 2.12194440e-4f;
    vf p = (vf){} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    vf y = p * r * r + r + 1.0f;
    vi e = (__builtin_convertvector(m, vi) + 127) << 23;
    return y * (vf)e;
}


/* The two hot loops, made for each head size (NC vectors of 16 floats) so that their sums stay
   in registers. scores_NC: the scores of keys j0..j0+15 (rows kb, kstride apart) for every row
   that sees j0, stored at dst + row * stride. values_NC: each row's weighted sums of the values
   of keys j0..j0+BLK-1 (below its limit) into its two running sums at acc (keys of even and of
   odd index). */
#define KERNELS(NC)                                                                              \
    static void scores_##NC(const float *qs, const float *kb, int64_t kstride, float *dst,      \
                            int64_t stride, int rows, int L, int j0, const int32_t *limit) {    \
        for (int row = 0; row < rows; row++) {                                                   \
            if (j0 >= limit[row % L]) continue;                                                  \
            const float *q = qs + row * NC * 16;                                                 \
            vf t[16];                                                                            \
            for (int w = 0; w < 16; w++) {                                                       \
                const float *k = kb + w * kstride;                                               \
                vf a = LD(q) * LD(k);                                                            \
                for (int c = 1; c < NC; c++) a += LD(q + 16 * c) * LD(k + 16 * c);              \
                t[w] = a;                                                                        \
            }                                                                                    \
            ST(dst + row * stride, reduce16(t));                                                 \
        }                                                                                        \
    }                                                                                            \
    static void values_##NC(const float *scratch, int64_t stride, const float *vg, int64_t vs,  \
                            float *acc, int rows, int L, int j0, const int32_t *limit) {        \
        for (int row = 0; row < rows; row++) {                                                   \
            int n = limit[row % L], end = j0 + BLK < n ? j0 + BLK : n;                           \
            const float *s = scratch + row * stride;                                             \
            float *a0 = acc + (int64_t)row * 2 * NC * 16, *a1 = a0 + NC * 16;                    \
            vf o0[NC], o1[NC];                                                                   \
            for (int c = 0; c < NC; c++) o0[c] = LD(a0 + 16 * c), o1[c] = LD(a1 + 16 * c);     \
            int j = j0;                                                                          \
            for (; j + 1 < end; j += 2) {                                                        \
                const float *v0 = vg + j * vs, *v1 = v0 + vs;                                    \
                float p0 = s[j], p1 = s[j + 1];                                                  \
                for (int c = 0; c < NC; c++)                                                     \
                    o0[c] += p0 * LD(v0 + 16 * c), o1[c] += p1 * LD(v1 + 16 * c);               \
            }                                                                                    \
            if (j < end)                                                                         \
                for (int c = 0; c < NC; c++) o0[c] += s[j] * LD(vg + j * vs + 16 * c);           \
            for (int c = 0; c < NC; c++) ST(a0 + 16 * c, o0[c]), ST(a1 + 16 * c, o1[c]);       \
        }                                                                                        \
    }

KERNELS(1)
KERNELS(2)
KERNELS(3)
KERNELS(4)
KERNELS(5)
KERNELS(6)
KERNELS(7)
KERNELS(8)
KERNELS(16)

typedef void (*Scores)(const float *, const float *, int64_t, float *, int64_t, int, int, int,
                       const int32_t *);
typedef void (*Values)(const float *, int64_t, const float *, int64_t, float *, int, int, int,
                       const int32_t *);

static void attend_group(const float *qs, const float *kg, int64_t ks, const float *vg, int64_t vs,
                         float *out, int64_t orow, int rows, int L, int S, int nc,
                         const int32_t *limit, const uint8_t *allowed, float *scratch,
                         Scores scores, Values values) {
    float pad[16 * 16 * 16];
    for (int j0 = 0; j0 < S; j0 += 16) {
        const float *kb = kg + (int64_t)j0 * ks;
        int64_t kstride = ks;
        if (j0 + 16 > S) { /* the last, partial block: its missing keys read as zeros */
            memset(pad, 0, sizeof pad);
            for (int j = j0; j < S; j++) memcpy(pad + (j - j0) * nc * 16, kg + j * ks, nc * 64);
            kb = pad, kstride = nc * 16;
        }
        scores(qs, kb, kstride, scratch + j0, S + 16, rows, L, j0, limit);
    }
    float total[rows];
    for (int row = 0; row < rows; row++) {
        int t = row % L, n = limit[t];
        float *s = scratch + (int64_t)row * (S + 16);
        const uint8_t *ok = allowed ? allowed + (int64_t)t * S : 0;
        if (ok)
            for (int j = 0; j < n; j++) s[j] = ok[j] ? s[j] : -3.0e38f;
        float top = -3.0e38f;
        for (int j = 0; j < n; j++) top = s[j] > top ? s[j] : top;
        int full = n - n % 16;
        vf lane = {};
        for (int j = 0; j < full; j += 16) {
            vf e = vexp(LD(s + j) - top);
            ST(s + j, e);
            lane += e;
        }
        if (full < n) {
            vf e = vexp(LD(s + full) - top);
            for (int w = 0; full + w < n; w++) lane[w] += e[w], s[full + w] = e[w];
        }
        if (ok)
            for (int j = 0; j < n; j++) s[j] = ok[j] ? s[j] : 0.0f;
        total[row] = lanes_total(lane);
    }
    float *acc = scratch + (int64_t)rows * (S + 16); /* [rows][2][nc * 16]: the values' sums */
    memset(acc, 0, sizeof(float) * rows * 2 * nc * 16);
    for (int j0 = 0; j0 < S; j0 += BLK) values(scratch, S + 16, vg, vs, acc, rows, L, j0, limit);
    for (int row = 0; row < rows; row++) {
        const float *a0 = acc + (int64_t)row * 2 * nc * 16, *a1 = a0 + nc * 16;
        for (int c = 0; c < nc; c++)
            ST(out + row * orow + 16 * c, (LD(a0 + 16 * c) + LD(a1 + 16 * c)) / total[row]);
    }
}

/* q [B,H,L,D], k / v [B,G,S,D], strides in floats (the last axis contiguous); out [B,H,L,D]
   contiguous; D one of 16, 32, 48, 64, 80, 96, 112, 128, 256. Query token t sees keys j < limit[t]
   (and, when `allowed` is not NULL, only those with allowed[t * S + j]). scratch: (H / G) * L *
   (S + 16 + 2 * D) floats; qs: (H / G) * L * D floats. Returns 0, or -1 for a shape it does
   not take. */
int edgespec_attend(const float *q, int64_t qb, int64_t qh, int64_t ql, const float *k,
                    int64_t kb, int64_t kh, int64_t ks, const float *v, int64_t vb, int64_t vh,
                    int64_t vs, float *out, int B, int H, int G, int L, int S, int D, float scale,
                    const int32_t *limit, const uint8_t *allowed, float *scratch, float *qs) {
    Scores scores;
    Values values;
    switch (D) {
    case 16: scores = scores_1, values = values_1; break;
    case 32: scores = scores_2, values = values_2; break;
    case 48: scores = scores_3, values = values_3; break;
    case 64: scores = scores_4, values = values_4; break;
    case 80: scores = scores_5, values = values_5; break;
    case 96: scores = scores_6, values = values_6; break;
    case 112: scores = scores_7, values = values_7; break;
    case 128: scores = scores_8, values = values_8; break;
    case 256: scores = scores_16, values = values_16; break;
    default: return -1;
    }
    if (H % G || S < 1) return -1;
    int R = H / G, rows = R * L;
    for (int b = 0; b < B; b++)
        for (int g = 0; g < G; g++) {
            for (int row = 0; row < rows; row++) {
                const float *src = q + b * qb + (g * R + row / L) * qh + (row % L) * ql;
                for (int d = 0; d < D; d++) qs[row * D + d] = src[d] * scale;
            }
            const float *kg = k + b * kb + g * kh, *vg = v + b * vb + g * vh;
            float *o = out + ((int64_t)b * H + (int64_t)g * R) * L * D;
            attend_group(qs, kg, ks, vg, vs, o, D, rows, L, S, D / 16, limit, allowed, scratch,
                         scores, values);
        }
    return 0;
}
