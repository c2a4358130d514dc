/* HYLA attention core on CPU, fused: forward and backward per (batch, query) row in cache-sized
 * scratch, never writing a B x H x Q x K tensor. Built and loaded by hyla/attention/kernels/c/wrapper.py
 * (plain C with OpenMP, called through ctypes); compiled once per REAL type (float, double).
 *
 * Layouts (all contiguous): q B x H x Q x E; kT B x H x E x K and vT B x H x D x K (keys innermost,
 * so the loops over keys vectorize); bias H x Q x K or NULL; keep (1 or B) x Q x K bytes or NULL
 * (nonzero = may attend); drop Q x K bytes or NULL: attention dropout on the normalized code, one mask for
 * every batch element and head (nonzero = kept, kept pairs divided by keep_prob). y B x H x Q x D. The backward writes dq B x H x Q x E, dkT B x H x E x K,
 * dvT B x H x D x K and dbias_parts T x H x Q x K (one partial sum per thread, summed by the caller).
 *
 * phi: 0 relu, 1 silu, 2 gelu (erf), 3 sigmoid, 4 tanh, 5 identity.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#ifndef REAL
#define REAL float
#define SUFFIX f32
#endif
#define CAT2(a, b) a##_##b
#define CAT(a, b) CAT2(a, b)
#define NAME(f) CAT(f, SUFFIX)

static inline REAL NAME(phi_fwd)(int phi, REAL u) {
    switch (phi) {
    case 0: return u > 0 ? u : (REAL)0;
    case 1: return u / ((REAL)1 + exp(-u));
    case 2: return (REAL)0.5 * u * ((REAL)1 + erf(u * (REAL)0.70710678118654752440));
    case 3: return (REAL)1 / ((REAL)1 + exp(-u));
    case 4: return tanh(u);
    default: return u;
    }
}

static inline REAL NAME(phi_grad)(int phi, REAL u, REAL g) { /* dphi/du given g = phi(u) */
    switch (phi) {
    case 0: return u > 0 ? (REAL)1 : (REAL)0;
    case 1: { REAL sg = (REAL)1 / ((REAL)1 + exp(-u)); return sg * ((REAL)1 + u * ((REAL)1 - sg)); }
    case 2: return (REAL)0.5 * ((REAL)1 + erf(u * (REAL)0.70710678118654752440))
                   + u * exp((REAL)-0.5 * u * u) * (REAL)0.39894228040143267794;
    case 3: return g * ((REAL)1 - g);
    case 4: return (REAL)1 - g * g;
    default: return (REAL)1;
    }
}

/* acc[k] += sum_j c_j x_j[k] over n rows (x_j = x + j * xs, c_j = c[j * cs]), four rows per pass so
 * that acc is loaded and stored once per four multiply-adds */
static inline void NAME(axpy_rows)(REAL *restrict acc, const REAL *restrict x, size_t xs, const REAL *restrict c,
                                   size_t cs, int n, int K) {
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        const REAL *x0 = x + j * xs, *x1 = x0 + xs, *x2 = x1 + xs, *x3 = x2 + xs;
        REAL c0 = c[j * cs], c1 = c[(j + 1) * cs], c2 = c[(j + 2) * cs], c3 = c[(j + 3) * cs];
        for (int k = 0; k < K; k++) acc[k] += c0 * x0[k] + c1 * x1[k] + c2 * x2[k] + c3 * x3[k];
    }
    for (; j < n; j++) {
        const REAL *xj = x + j * xs;
        REAL cj = c[j * cs];
        for (int k = 0; k < K; k++) acc[k] += cj * xj[k];
    }
}

/* acc[k] += sum_j x_j[k] y_j[k] over n rows (x_j = x + j * xs, y_j = y + j * ys), four rows per pass */
static inline void NAME(acc_rows)(REAL *restrict acc, const REAL *restrict x, size_t xs, const REAL *restrict y,
                                  size_t ys, int n, int K) {
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        const REAL *x0 = x + j * xs, *x1 = x0 + xs, *x2 = x1 + xs, *x3 = x2 + xs;
        const REAL *y0 = y + j * ys, *y1 = y0 + ys, *y2 = y1 + ys, *y3 = y2 + ys;
        for (int k = 0; k < K; k++) acc[k] += x0[k] * y0[k] + x1[k] * y1[k] + x2[k] * y2[k] + x3[k] * y3[k];
    }
    for (; j < n; j++) {
        const REAL *xj = x + j * xs, *yj = y + j * ys;
        for (int k = 0; k < K; k++) acc[k] += xj[k] * yj[k];
    }
}

/* scores of row (b, q): a[h*K + k] (normalized code) and r[k]; raw masked scores are a / r */
static void NAME(row_code)(const REAL *restrict q, const REAL *restrict kT, const REAL *restrict bias, const unsigned char *restrict keep,
                           int H, int Q, int K, int E, int b, int qi, REAL scale, int rms, REAL eps,
                           REAL *restrict a, REAL *restrict r) {
    for (int h = 0; h < H; h++) {
        REAL *restrict ah = a + (size_t)h * K;
        if (bias) memcpy(ah, bias + ((size_t)h * Q + qi) * K, sizeof(REAL) * K);
        else memset(ah, 0, sizeof(REAL) * K);
        const REAL *restrict qh = q + (((size_t)b * H + h) * Q + qi) * E;
        const REAL *restrict kh = kT + ((size_t)b * H + h) * E * K;
        REAL *restrict raw = r; /* r is filled below: hold this head's raw scores there */
        memset(raw, 0, sizeof(REAL) * K);
        NAME(axpy_rows)(raw, kh, K, qh, 1, E, K);
        for (int k = 0; k < K; k++) ah[k] += scale * raw[k];
        if (keep)
            for (int k = 0; k < K; k++) ah[k] = keep[k] ? ah[k] : (REAL)0;
    }
    for (int k = 0; k < K; k++) r[k] = (REAL)1;
    if (rms) {
        for (int k = 0; k < K; k++) r[k] = 0;
        for (int h = 0; h < H; h++)
            for (int k = 0; k < K; k++) r[k] += a[(size_t)h * K + k] * a[(size_t)h * K + k];
        for (int k = 0; k < K; k++) r[k] = (REAL)1 / sqrt(r[k] / (REAL)H + eps);
        for (int h = 0; h < H; h++)
            for (int k = 0; k < K; k++) a[(size_t)h * K + k] *= r[k];
    }
}

/* attention dropout on row qi's normalized code: a[h,k] = drop[k] ? a[h,k] / keep_prob : 0 (all heads) */
static void NAME(row_drop)(REAL *restrict a, const unsigned char *restrict drop, REAL keep_prob, int H, int K) {
    for (int h = 0; h < H; h++)
        for (int k = 0; k < K; k++) a[(size_t)h * K + k] = drop[k] ? a[(size_t)h * K + k] / keep_prob : (REAL)0;
}

/* u^T[d*K + k] = sum_h a[h,k] v[h,k,d]; g^T = phi(u^T) */
static void NAME(row_value)(const REAL *restrict vT, const REAL *restrict a, int H, int K, int D, int b, int phi,
                            REAL *restrict uT, REAL *restrict gT) {
    memset(uT, 0, sizeof(REAL) * D * K);
    const REAL *restrict vb = vT + (size_t)b * H * D * K;
    for (int d = 0; d < D; d++) NAME(acc_rows)(uT + (size_t)d * K, a, K, vb + (size_t)d * K, (size_t)D * K, H, K);
    for (int i = 0; i < D * K; i++) gT[i] = NAME(phi_fwd)(phi, uT[i]);
}

static size_t NAME(scratch_len)(int H, int K, int D) { return (size_t)3 * H * K + 4 * (size_t)D * K + K; }

int NAME(hyla_forward)(const REAL *restrict q, const REAL *restrict kT, const REAL *restrict vT, const REAL *restrict bias,
                       const unsigned char *restrict keep, int keep_batched, const unsigned char *restrict drop,
                       REAL keep_prob, int B, int H, int Q, int K, int E, int D, REAL scale, int rms, REAL eps,
                       int phi, int threads, REAL *restrict y) {
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        REAL *buf = (REAL *)malloc(sizeof(REAL) * NAME(scratch_len)(H, K, D));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (long row = 0; row < (long)B * Q; row++) {
            if (!buf) continue;
            int b = (int)(row / Q), qi = (int)(row % Q);
            REAL *restrict a = buf, *r = a + (size_t)H * K, *uT = r + K, *gT = uT + (size_t)D * K;
            const unsigned char *restrict kp = keep ? keep + ((size_t)(keep_batched ? b : 0) * Q + qi) * K : NULL;
            NAME(row_code)(q, kT, bias, kp, H, Q, K, E, b, qi, scale, rms, eps, a, r);
            if (drop) NAME(row_drop)(a, drop + (size_t)qi * K, keep_prob, H, K);
            NAME(row_value)(vT, a, H, K, D, b, phi, uT, gT);
            for (int h = 0; h < H; h++) {
                const REAL *restrict ah = a + (size_t)h * K;
                REAL *restrict yh = y + (((size_t)b * H + h) * Q + qi) * D;
                for (int d = 0; d < D; d++) {
                    const REAL *restrict gd = gT + (size_t)d * K;
                    REAL acc = 0;
                    for (int k = 0; k < K; k++) acc += ah[k] * gd[k];
                    yh[d] = acc;
                }
            }
        }
        free(buf);
    }
    return failed;
}

/* rows of a query block: dv and dk take their sums over the block's queries in one pass each */
#define QBLOCK 8

int NAME(hyla_backward)(const REAL *restrict q, const REAL *restrict kT, const REAL *restrict vT, const REAL *restrict bias,
                        const unsigned char *restrict keep, int keep_batched, const unsigned char *restrict drop,
                        REAL keep_prob, int B, int H, int Q, int K, int E, int D, REAL scale, int rms, REAL eps,
                        int phi, int threads, const REAL *restrict dy,
                        REAL *restrict dq, REAL *restrict dkT, REAL *restrict dvT, REAL *restrict dbias_parts) {
    int failed = 0;
    memset(dkT, 0, sizeof(REAL) * B * H * E * K);
    memset(dvT, 0, sizeof(REAL) * B * H * D * K);
    if (dbias_parts) memset(dbias_parts, 0, sizeof(REAL) * threads * H * Q * K);
    /* per row of a block: a, da, ds (H x K), r (K), u^T, g^T, dg^T = du^T (D x K), scaled q (H x E) */
    const size_t row_len = (size_t)3 * H * K + K + (size_t)3 * D * K + (size_t)H * E;
#pragma omp parallel num_threads(threads)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        REAL *buf = (REAL *)malloc(sizeof(REAL) * row_len * QBLOCK);
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
        REAL *restrict dbias = dbias_parts ? dbias_parts + (size_t)tid * H * Q * K : NULL;
        /* rows of one batch element stay on one thread: dk and dv accumulate over its queries */
#pragma omp for schedule(static)
        for (int b = 0; b < B; b++) {
            if (!buf) continue;
            for (int q0 = 0; q0 < Q; q0 += QBLOCK) {
                int nb = Q - q0 < QBLOCK ? Q - q0 : QBLOCK;
                for (int j = 0; j < nb; j++) {
                    int qi = q0 + j;
                    REAL *restrict a = buf + j * row_len, *da = a + (size_t)H * K, *ds = da + (size_t)H * K;
                    REAL *restrict r = ds + (size_t)H * K, *uT = r + K, *gT = uT + (size_t)D * K;
                    REAL *restrict duT = gT + (size_t)D * K, *qs = duT + (size_t)D * K;
                    const unsigned char *restrict kp =
                        keep ? keep + ((size_t)(keep_batched ? b : 0) * Q + qi) * K : NULL;
                    NAME(row_code)(q, kT, bias, kp, H, Q, K, E, b, qi, scale, rms, eps, a, r);
                    /* with dropout, a holds the dropped code (what the value network sees) and ds, until it
                     * is written below, the normalized code (what RMSHead's gradient needs) */
                    const unsigned char *restrict dp = drop ? drop + (size_t)qi * K : NULL;
                    const REAL *an = a; /* not restrict: it may point into ds */
                    if (dp) {
                        memcpy(ds, a, sizeof(REAL) * H * K);
                        NAME(row_drop)(a, dp, keep_prob, H, K);
                        an = ds;
                    }
                    NAME(row_value)(vT, a, H, K, D, b, phi, uT, gT);
                    /* through y = a g:  dg^T[d,k] = sum_h a[h,k] dy[h,d];  da[h,k] = sum_d dy[h,d] g[k,d] */
                    const REAL *restrict dyq = dy + ((size_t)b * H * Q + qi) * D; /* dy[h,d] = dyq[h*Q*D + d] */
                    memset(duT, 0, sizeof(REAL) * D * K);
                    memset(da, 0, sizeof(REAL) * H * K);
                    for (int d = 0; d < D; d++)
                        NAME(axpy_rows)(duT + (size_t)d * K, a, K, dyq + d, (size_t)Q * D, H, K);
                    for (int h = 0; h < H; h++)
                        NAME(axpy_rows)(da + (size_t)h * K, gT, K, dyq + (size_t)h * Q * D, 1, D, K);
                    for (int i = 0; i < D * K; i++) duT[i] *= NAME(phi_grad)(phi, uT[i], gT[i]);
                    /* through u = a v:  da[h,k] += sum_d du[k,d] v[h,k,d]  (dv: after the block) */
                    for (int h = 0; h < H; h++) {
                        REAL *restrict dah = da + (size_t)h * K;
                        const REAL *restrict vh = vT + ((size_t)b * H + h) * D * K;
                        NAME(acc_rows)(dah, duT, K, vh, K, D, K);
                    }
                    /* through the dropout: da of the normalized code */
                    if (dp) NAME(row_drop)(da, dp, keep_prob, H, K);
                    /* RMSHead: ds = r (da - a m / H), m = sum_h a da (a: the normalized code); masked pairs get
                     * no gradient */
                    if (rms) {
                        REAL *restrict m = uT; /* u is no longer needed: reuse its first K entries */
                        for (int k = 0; k < K; k++) m[k] = 0;
                        for (int h = 0; h < H; h++)
                            for (int k = 0; k < K; k++) m[k] += an[(size_t)h * K + k] * da[(size_t)h * K + k];
                        for (int k = 0; k < K; k++) m[k] /= (REAL)H;
                        for (int h = 0; h < H; h++)
                            for (int k = 0; k < K; k++) {
                                size_t i = (size_t)h * K + k;
                                ds[i] = r[k] * (da[i] - an[i] * m[k]); /* an may be ds: read before written */
                            }
                    } else {
                        memcpy(ds, da, sizeof(REAL) * H * K);
                    }
                    if (kp)
                        for (int h = 0; h < H; h++)
                            for (int k = 0; k < K; k++) ds[(size_t)h * K + k] = kp[k] ? ds[(size_t)h * K + k] : (REAL)0;
                    /* scores s = scale q k + bias:  dq[h,e] = scale sum_k ds[h,k] k[h,e,k]  (dk: after the block) */
                    for (int h = 0; h < H; h++) {
                        const REAL *restrict dsh = ds + (size_t)h * K;
                        if (dbias) {
                            REAL *restrict dbh = dbias + ((size_t)h * Q + qi) * K;
                            for (int k = 0; k < K; k++) dbh[k] += dsh[k];
                        }
                        const REAL *restrict qh = q + (((size_t)b * H + h) * Q + qi) * E;
                        const REAL *restrict kh = kT + ((size_t)b * H + h) * E * K;
                        REAL *restrict dqh = dq + (((size_t)b * H + h) * Q + qi) * E;
                        for (int e = 0; e < E; e++) {
                            const REAL *restrict ke = kh + (size_t)e * K;
                            REAL acc = 0;
                            for (int k = 0; k < K; k++) acc += dsh[k] * ke[k];
                            dqh[e] = acc * scale;
                            qs[(size_t)h * E + e] = qh[e] * scale;
                        }
                    }
                }
                /* the block's sums: dv[h,d,k] += sum_j a_j[h,k] du_j[d,k];  dk[h,e,k] += sum_j ds_j[h,k] q_j[h,e] */
                for (int h = 0; h < H; h++) {
                    const REAL *a0 = buf + (size_t)h * K;
                    const REAL *ds0 = buf + (size_t)2 * H * K + (size_t)h * K;
                    const REAL *du0 = buf + (size_t)3 * H * K + K + (size_t)2 * D * K;
                    const REAL *qs0 = buf + (size_t)3 * H * K + K + (size_t)3 * D * K + (size_t)h * E;
                    for (int d = 0; d < D; d++)
                        NAME(acc_rows)(dvT + (((size_t)b * H + h) * D + d) * K, a0, row_len, du0 + (size_t)d * K,
                                       row_len, nb, K);
                    for (int e = 0; e < E; e++)
                        NAME(axpy_rows)(dkT + (((size_t)b * H + h) * E + e) * K, ds0, row_len, qs0 + e, row_len, nb, K);
                }
            }
        }
        free(buf);
    }
    return failed;
}
