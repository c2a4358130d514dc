/* HYLA attention core on CPU, fused: forward and backward per (batch, query) row in cache-sized
 * scratch, never writing a B x H x Q x K tensor. Built and loaded by hyla/attention/kernels/cpu.py
 * (plain C with OpenMP, called through ctypes); compiled once per REAL type (float, double).
 *
 * Layouts (all contiguous): q B x H x Q x E; kT B x H x E x K and vT B x H x D x K (keys innermost,
 * so the loops over keys vectorize); bias H x Q x K or NULL; keep (1 or B) x Q x K bytes or NULL
 * (nonzero = may attend). y B x H x Q x D. The backward writes dq B x H x Q x E, dkT B x H x E x K,
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
        for (int e = 0; e < E; e++) {
            REAL qe = qh[e] * scale;
            const REAL *restrict ke = kh + (size_t)e * K;
            for (int k = 0; k < K; k++) ah[k] += qe * ke[k];
        }
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

/* u^T[d*K + k] = sum_h a[h,k] v[h,k,d]; g^T = phi(u^T) */
static void NAME(row_value)(const REAL *restrict vT, const REAL *restrict a, int H, int K, int D, int b, int phi,
                            REAL *restrict uT, REAL *restrict gT) {
    memset(uT, 0, sizeof(REAL) * D * K);
    for (int h = 0; h < H; h++) {
        const REAL *restrict ah = a + (size_t)h * K;
        const REAL *restrict vh = vT + ((size_t)b * H + h) * D * K;
        for (int d = 0; d < D; d++) {
            const REAL *restrict vd = vh + (size_t)d * K;
            REAL *restrict ud = uT + (size_t)d * K;
            for (int k = 0; k < K; k++) ud[k] += ah[k] * vd[k];
        }
    }
    for (int i = 0; i < D * K; i++) gT[i] = NAME(phi_fwd)(phi, uT[i]);
}

static size_t NAME(scratch_len)(int H, int K, int D) { return (size_t)3 * H * K + 4 * (size_t)D * K + K; }

int NAME(hyla_forward)(const REAL *restrict q, const REAL *restrict kT, const REAL *restrict vT, const REAL *restrict bias,
                       const unsigned char *restrict keep, int keep_batched, int B, int H, int Q, int K, int E,
                       int D, REAL scale, int rms, REAL eps, int phi, int threads, REAL *restrict y) {
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

int NAME(hyla_backward)(const REAL *restrict q, const REAL *restrict kT, const REAL *restrict vT, const REAL *restrict bias,
                        const unsigned char *restrict keep, int keep_batched, int B, int H, int Q, int K, int E,
                        int D, REAL scale, int rms, REAL eps, int phi, int threads, const REAL *restrict dy,
                        REAL *restrict dq, REAL *restrict dkT, REAL *restrict dvT, REAL *restrict dbias_parts) {
    int failed = 0;
    memset(dkT, 0, sizeof(REAL) * B * H * E * K);
    memset(dvT, 0, sizeof(REAL) * B * H * D * K);
    if (dbias_parts) memset(dbias_parts, 0, sizeof(REAL) * threads * H * Q * K);
#pragma omp parallel num_threads(threads)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        REAL *buf = (REAL *)malloc(sizeof(REAL) * NAME(scratch_len)(H, K, D));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
        REAL *restrict dbias = dbias_parts ? dbias_parts + (size_t)tid * H * Q * K : NULL;
        /* rows of one batch element stay on one thread: dk and dv accumulate over its queries */
#pragma omp for schedule(static)
        for (int b = 0; b < B; b++) {
            if (!buf) continue;
            REAL *restrict a = buf, *r = a + (size_t)H * K, *uT = r + K, *gT = uT + (size_t)D * K;
            REAL *restrict dgT = gT + (size_t)D * K, *duT = dgT + (size_t)D * K, *da = duT + (size_t)D * K;
            REAL *restrict ds = da + (size_t)H * K;
            for (int qi = 0; qi < Q; qi++) {
                const unsigned char *restrict kp = keep ? keep + ((size_t)(keep_batched ? b : 0) * Q + qi) * K : NULL;
                NAME(row_code)(q, kT, bias, kp, H, Q, K, E, b, qi, scale, rms, eps, a, r);
                NAME(row_value)(vT, a, H, K, D, b, phi, uT, gT);
                /* through y = a g:  dg^T[d,k] = sum_h a[h,k] dy[h,d];  da[h,k] = sum_d dy[h,d] g[k,d] */
                memset(dgT, 0, sizeof(REAL) * D * K);
                for (int h = 0; h < H; h++) {
                    const REAL *restrict ah = a + (size_t)h * K;
                    const REAL *restrict dyh = dy + (((size_t)b * H + h) * Q + qi) * D;
                    REAL *restrict dah = da + (size_t)h * K;
                    memset(dah, 0, sizeof(REAL) * K);
                    for (int d = 0; d < D; d++) {
                        REAL c = dyh[d];
                        const REAL *restrict gd = gT + (size_t)d * K;
                        REAL *restrict dgd = dgT + (size_t)d * K;
                        for (int k = 0; k < K; k++) {
                            dgd[k] += ah[k] * c;
                            dah[k] += c * gd[k];
                        }
                    }
                }
                for (int i = 0; i < D * K; i++) duT[i] = dgT[i] * NAME(phi_grad)(phi, uT[i], gT[i]);
                /* through u = a v:  da[h,k] += sum_d du[k,d] v[h,k,d];  dv[h,k,d] += a[h,k] du[k,d] */
                for (int h = 0; h < H; h++) {
                    const REAL *restrict ah = a + (size_t)h * K;
                    REAL *restrict dah = da + (size_t)h * K;
                    const REAL *restrict vh = vT + ((size_t)b * H + h) * D * K;
                    REAL *restrict dvh = dvT + ((size_t)b * H + h) * D * K;
                    for (int d = 0; d < D; d++) {
                        const REAL *restrict vd = vh + (size_t)d * K, *dud = duT + (size_t)d * K;
                        REAL *restrict dvd = dvh + (size_t)d * K;
                        for (int k = 0; k < K; k++) {
                            dah[k] += dud[k] * vd[k];
                            dvd[k] += ah[k] * dud[k];
                        }
                    }
                }
                /* RMSHead: ds = r (da - a m / H), m = sum_h a da; masked pairs get no gradient */
                if (rms) {
                    REAL *restrict m = uT; /* u is no longer needed: reuse its first K entries */
                    for (int k = 0; k < K; k++) m[k] = 0;
                    for (int h = 0; h < H; h++)
                        for (int k = 0; k < K; k++) m[k] += a[(size_t)h * K + k] * da[(size_t)h * K + k];
                    for (int k = 0; k < K; k++) m[k] /= (REAL)H;
                    for (int h = 0; h < H; h++)
                        for (int k = 0; k < K; k++) {
                            size_t i = (size_t)h * K + k;
                            ds[i] = r[k] * (da[i] - a[i] * m[k]);
                        }
                } else {
                    memcpy(ds, da, sizeof(REAL) * H * K);
                }
                if (kp)
                    for (int h = 0; h < H; h++)
                        for (int k = 0; k < K; k++) ds[(size_t)h * K + k] = kp[k] ? ds[(size_t)h * K + k] : (REAL)0;
                /* scores: s = scale q k + bias */
                for (int h = 0; h < H; h++) {
                    const REAL *restrict dsh = ds + (size_t)h * K;
                    if (dbias) {
                        REAL *restrict dbh = dbias + ((size_t)h * Q + qi) * K;
                        for (int k = 0; k < K; k++) dbh[k] += dsh[k];
                    }
                    const REAL *restrict qh = q + (((size_t)b * H + h) * Q + qi) * E;
                    const REAL *restrict kh = kT + ((size_t)b * H + h) * E * K;
                    REAL *restrict dqh = dq + (((size_t)b * H + h) * Q + qi) * E;
                    REAL *restrict dkh = dkT + ((size_t)b * H + h) * E * K;
                    for (int e = 0; e < E; e++) {
                        const REAL *restrict ke = kh + (size_t)e * K;
                        REAL *restrict dke = dkh + (size_t)e * K;
                        REAL qe = qh[e] * scale, acc = 0;
                        for (int k = 0; k < K; k++) {
                            acc += dsh[k] * ke[k];
                            dke[k] += dsh[k] * qe;
                        }
                        dqh[e] = acc * scale;
                    }
                }
            }
        }
        free(buf);
    }
    return failed;
}
