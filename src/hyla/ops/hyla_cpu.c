/* HYLA attention core on CPU, fused: forward and backward per (batch, query) row in cache-sized
 * scratch, never writing a B x H x Q x K tensor. The same rows compute the other variants of the paper's
 * grid that are local to a query row: normalization none, RMSHead or softmax (over the row's keys), and the
 * value network hyper (HYLA's) or linear (standard multi-head attention's: softmax attention itself). Built and loaded by hyla/attention/kernels/c/wrapper.py
 * (plain C with OpenMP, called through ctypes); compiled once per REAL type (float, double).
 *
 * Inputs and outputs in any strides (element strides of the b, h, t, feature axes, so the transposed views
 * the model makes are read and written as they are): q B x H x Q x E, k B x H x K x E, v B x H x K x D,
 * y and dy B x H x Q x D, dq, dk, dv like q, k, v. bias H x Q x K (contiguous) or NULL; keep (1 or B) x Q x K
 * bytes or NULL (nonzero = may attend); drop Q x K bytes or NULL: attention dropout on the normalized code,
 * one mask for every batch element and head (nonzero = kept, kept pairs divided by keep_prob). dbias
 * H x Q x K (contiguous) or NULL.
 *
 * Inside, each batch element's keys and values are packed as H x E x KP and H x D x KP with the keys padded
 * to KP, a multiple of VW, and every loop over keys works on whole vectors of VW lanes (GCC vector
 * extensions: the order of every sum is fixed by this source, whatever -march the compiler targets).
 * Padded keys carry zeros and are masked, so they change no sum.
 *
 * phi: 0 relu, 1 silu, 2 gelu (erf), 3 sigmoid, 4 tanh, 5 identity. norm: NORM_NONE, NORM_RMS, NORM_SOFTMAX.
 * linear: 0 the hyper value network, 1 the linear one (phi unused).
 */
#define _POSIX_C_SOURCE 200112L
#include <tgmath.h> /* sqrt, exp, erf, tanh of the argument's type */
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

#define VW 8 /* lanes per vector: 36 keys (SRAVEN) pad to 40, 32 (fuzzy logic) to 32 */
#define ALIGN 64
typedef REAL vec __attribute__((vector_size(VW * sizeof(REAL))));
typedef __typeof__((vec){0} > (vec){0}) vmask; /* a comparison's lanes: all bits set where true */
typedef long long i64;

#define NORM_NONE 0
#define NORM_RMS 1
#define NORM_SOFTMAX 2
#define IS_F32_f32 1
#define IS_F32_f64 0
#define IS_F32(suffix) CAT2(IS_F32, suffix)

static inline vec vmax(vec a, vec b) {
    const vmask gt = a > b;
    return (vec)((gt & (vmask)a) | (~gt & (vmask)b));
}

/* exp of each lane, for softmax's exp(s - max) <= 0 (inputs below -87 are taken as -87: exp gives 1.6e-38
 * there, and the row's sum is at least 1). float: Cephes' expf (round to n ln 2, two-part reduction, degree-7
 * polynomial, 2^n from the exponent bits), within 2 ulp of exp, in vector lanes with a fixed order of
 * operations; double: libm's exp, lane by lane. */
static inline vec vexp(vec x) {
    x = vmax(x, (vec){0} - (REAL)87);
#if IS_F32(SUFFIX)
    typedef int vint __attribute__((vector_size(VW * sizeof(int))));
    const vec round = (vec){0} + 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    const vec n = (x * 1.44269504088896341f + round) - round;
    const vec r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    vec p = (vec){0} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = (p * (r * r) + r) + 1.0f;
    const vint scale = (__builtin_convertvector(n, vint) + 127) << 23;
    return p * (vec)scale;
#else
    vec out;
    for (int i = 0; i < VW; i++) out[i] = exp(x[i]);
    return out;
#endif
}

static inline REAL phi_fwd(int phi, REAL u) {
    switch (phi) {
    case 0: return u > 0 ? u : (REAL)0;
    case 1: return u / ((REAL)1 + exp(-u));
    case 2: return (REAL)0.5 * u * ((REAL)1 + erf(u * (REAL)0.70710678118654752440));
    case 3: return (REAL)1 / ((REAL)1 + exp(-u));
    case 4: return tanh(u);
    default: return u;
    }
}

static inline REAL phi_grad(int phi, REAL u, REAL g) { /* dphi/du given g = phi(u) */
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

/* the lanes' sum in a fixed order */
static inline REAL hsum(vec x) {
    return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]));
}

typedef struct {
    int B, H, Q, K, E, D, KP, NV, norm, linear, phi, keep_batched;
    REAL scale, eps, keep_prob;
    const REAL *q, *k, *v;
    i64 qs[4], ks[4], vs[4];
    const vec *bias; /* packed H x Q x KP, or NULL */
    const unsigned char *keep, *drop;
} args_t;

/* one query row's scratch (vectors): normalized code an, code after dropout a, their gradients da, ds
 * (H x NV each), the key-wise factors keepv, dropv, r (NV each), u, g, du (D x NV each; the hyper value
 * network's) */
typedef struct {
    vec *an, *a, *da, *ds, *keepv, *dropv, *r, *u, *g, *du;
    REAL *qs; /* scaled q of the row, H x E */
} row_t;

static size_t row_vectors(const args_t *A) { return (size_t)A->NV * (4 * A->H + 3 + 3 * A->D); }

static void row_bind(const args_t *A, vec *buf, REAL *qs, row_t *s) {
    size_t hv = (size_t)A->H * A->NV, dv = (size_t)A->D * A->NV;
    s->an = buf; s->a = s->an + hv; s->da = s->a + hv; s->ds = s->da + hv;
    s->keepv = s->ds + hv; s->dropv = s->keepv + A->NV; s->r = s->dropv + A->NV;
    s->u = s->r + A->NV; s->g = s->u + dv; s->du = s->g + dv;
    s->qs = qs;
}

static void *alloc_aligned(size_t bytes) {
    void *p = NULL;
    return posix_memalign(&p, ALIGN, bytes ? bytes : ALIGN) == 0 ? p : NULL;
}

/* the backward's dy and what it writes (dq, dk, dv), each with its strides */
typedef struct {
    const REAL *dy;
    REAL *dq, *dk, *dv;
    i64 dys[4], dqs[4], dks[4], dvs[4];
} grads_t;

/* The per-row code below takes the sizes H, NV, E, D and the variant (NORM, LIN: A->norm, A->linear) as
 * arguments and is always inlined: the kernel's entry points call it through copies specialized to the paper's
 * models (SRAVEN: 16 heads, 36 keys, head dim 4; fuzzy logic: 8 heads, 32 keys, head dim 2), where those sizes
 * are constants and the compiler unrolls the short loops and keeps the accumulators in registers; HYLA's and
 * softmax attention's copies also fix the variant, so no choice between variants is left inside their loops
 * (the arithmetic is the same in every copy). Other variants at those sizes, and any other size, take copies
 * that read the variant at run time. Sums over a short axis keep up to CHUNK accumulators at a time. */
#define INLINE static inline __attribute__((always_inline))
#define CHUNK 8

/* batch element b's keys and values as H x E x KP and H x D x KP vectors, pads zero (read key by key: in
 * the model's layout a key's heads and features are contiguous) */
INLINE void pack_kv(const args_t *A, int b, vec *kp, vec *vp, const int H, const int NV, const int E, const int D) {
    const int K = A->K, KP = NV * VW;
    REAL *kr = (REAL *)kp, *vr = (REAL *)vp;
    for (int h = 0; h < H; h++) {
        for (int e = 0; e < E; e++) kp[((size_t)h * E + e + 1) * NV - 1] = (vec){0};
        for (int d = 0; d < D; d++) vp[((size_t)h * D + d + 1) * NV - 1] = (vec){0};
    }
    for (int j = 0; j < K; j++) {
        const REAL *kj = A->k + b * A->ks[0] + j * A->ks[2];
        const REAL *vj = A->v + b * A->vs[0] + j * A->vs[2];
        for (int h = 0; h < H; h++) {
            for (int e = 0; e < E; e++) kr[((size_t)h * E + e) * KP + j] = kj[h * A->ks[1] + e * A->ks[3]];
            for (int d = 0; d < D; d++) vr[((size_t)h * D + d) * KP + j] = vj[h * A->vs[1] + d * A->vs[3]];
        }
    }
}

/* the batch element's dk and dv, summed in dkp, dvp, written out in their strides */
INLINE void unpack_grads(const args_t *A, const grads_t *G, int b, const vec *dkp, const vec *dvp, const int H,
                         const int NV, const int E, const int D) {
    const int KP = NV * VW;
    const REAL *dkr = (const REAL *)dkp, *dvr = (const REAL *)dvp;
    for (int j = 0; j < A->K; j++) {
        REAL *dkj = G->dk + b * G->dks[0] + j * G->dks[2];
        REAL *dvj = G->dv + b * G->dvs[0] + j * G->dvs[2];
        for (int h = 0; h < H; h++) {
            for (int e = 0; e < E; e++) dkj[h * G->dks[1] + e * G->dks[3]] = dkr[((size_t)h * E + e) * KP + j];
            for (int d = 0; d < D; d++) dvj[h * G->dvs[1] + d * G->dvs[3]] = dvr[((size_t)h * D + d) * KP + j];
        }
    }
}

/* out[k] = sum_h x[h, k] y[h, k] (H x NV vectors each), CHUNK keys' vectors at a time */
INLINE void head_dot(const vec *x, const vec *y, vec *out, const int H, const int NV) {
    for (int c0 = 0; c0 < NV; c0 += CHUNK) {
        const int n = NV - c0 < CHUNK ? NV - c0 : CHUNK;
        vec acc[CHUNK];
        for (int c = 0; c < n; c++) acc[c] = (vec){0};
        for (int h = 0; h < H; h++)
            for (int c = 0; c < n; c++) acc[c] += x[(size_t)h * NV + c0 + c] * y[(size_t)h * NV + c0 + c];
        for (int c = 0; c < n; c++) out[c0 + c] = acc[c];
    }
}

/* out[d, k] = sum_h a[h, k] w[h, d, k] (out D x NV vectors, a H x NV), with w's vector for (h, d, key vector c)
 * at w[(h * D + d) * hd_stride + c * c_stride]: c_stride 0 gives one vector for all keys */
INLINE void head_mix(const vec *a, const vec *w, const size_t hd_stride, const size_t c_stride, vec *out, const int H,
                     const int NV, const int D) {
    for (int c = 0; c < NV; c++)
        for (int d0 = 0; d0 < D; d0 += CHUNK) {
            const int n = D - d0 < CHUNK ? D - d0 : CHUNK;
            vec acc[CHUNK];
            for (int d = 0; d < n; d++) acc[d] = (vec){0};
            for (int h = 0; h < H; h++) {
                const vec ahc = a[(size_t)h * NV + c];
                for (int d = 0; d < n; d++) acc[d] += ahc * w[((size_t)h * D + d0 + d) * hd_stride + c * c_stride];
            }
            for (int d = 0; d < n; d++) out[(size_t)(d0 + d) * NV + c] = acc[d];
        }
}

/* row (b, qi) forward: s->an (normalized code), s->a (after dropout), s->r, s->u, s->g */
INLINE void row_forward(const args_t *A, const vec *kp, const vec *vp, int b, int qi, row_t *s, const int H,
                        const int NV, const int E, const int D, const int NORM, const int LIN) {
    const int K = A->K, KP = NV * VW;
    REAL *keepr = (REAL *)s->keepv, *dropr = (REAL *)s->dropv;
    const unsigned char *kq = A->keep ? A->keep + ((size_t)(A->keep_batched ? b : 0) * A->Q + qi) * K : NULL;
    const unsigned char *dq = A->drop ? A->drop + (size_t)qi * K : NULL;
    const REAL inv_keep = (REAL)1 / A->keep_prob;
    for (int j = 0; j < KP; j++) {
        keepr[j] = j < K && (!kq || kq[j]) ? (REAL)1 : (REAL)0;
        dropr[j] = j < K && dq ? (dq[j] ? inv_keep : (REAL)0) : (REAL)1;
    }
    const REAL *qrow = A->q + b * A->qs[0] + qi * A->qs[2];
    for (int h = 0; h < H; h++)
        for (int e = 0; e < E; e++) s->qs[h * E + e] = qrow[h * A->qs[1] + e * A->qs[3]] * A->scale;
    /* scores s = scale q.k + bias, masked: zero, or for softmax -1e30 (never the maximum) */
    const int softmax = NORM == NORM_SOFTMAX;
    for (int h = 0; h < H; h++) {
        const REAL *qh = s->qs + (size_t)h * E;
        const vec *bh = A->bias ? A->bias + ((size_t)h * A->Q + qi) * NV : NULL;
        for (int c = 0; c < NV; c++) {
            vec acc = bh ? bh[c] : (vec){0};
            for (int e = 0; e < E; e++) acc += qh[e] * kp[((size_t)h * E + e) * NV + c];
            s->an[(size_t)h * NV + c] =
                softmax ? acc * s->keepv[c] + (s->keepv[c] - (REAL)1) * (REAL)1e30 : acc * s->keepv[c];
        }
    }
    /* softmax over the keys of each head; a row with no visible key gets zeros */
    if (softmax) {
        for (int h = 0; h < H; h++) {
            vec *sh = s->an + (size_t)h * NV;
            vec mv = sh[0];
            for (int c = 1; c < NV; c++) mv = vmax(mv, sh[c]);
            REAL mx = mv[0];
            for (int i = 1; i < VW; i++) mx = mv[i] > mx ? mv[i] : mx;
            vec total = {0};
            for (int c = 0; c < NV; c++) {
                sh[c] = vexp(sh[c] - mx) * s->keepv[c];
                total += sh[c];
            }
            const REAL sum = hsum(total), inv = sum > 0 ? (REAL)1 / sum : (REAL)0;
            for (int c = 0; c < NV; c++) sh[c] *= inv;
        }
    }
    /* RMSHead over the heads of each key */
    if (NORM == NORM_RMS) {
        head_dot(s->an, s->an, s->r, H, NV);
        REAL *rr = (REAL *)s->r;
        for (int j = 0; j < KP; j++) rr[j] = (REAL)1 / sqrt(rr[j] / (REAL)H + A->eps);
        for (int h = 0; h < H; h++)
            for (int c = 0; c < NV; c++) s->an[(size_t)h * NV + c] *= s->r[c];
    }
    if (A->drop) {
        for (int h = 0; h < H; h++)
            for (int c = 0; c < NV; c++) s->a[(size_t)h * NV + c] = s->an[(size_t)h * NV + c] * s->dropv[c];
    } else {
        memcpy(s->a, s->an, sizeof(vec) * H * NV);
    }
    if (LIN) return;
    /* the generated value network: u[d, k] = sum_h a[h, k] v[h, k, d], g = phi(u) */
    head_mix(s->a, vp, NV, 1, s->u, H, NV, D);
    const REAL *ur = (const REAL *)s->u;
    REAL *gr = (REAL *)s->g;
    if (A->phi == 0)
        for (int i = 0; i < D * KP; i++) gr[i] = ur[i] > 0 ? ur[i] : (REAL)0;
    else
        for (int i = 0; i < D * KP; i++) gr[i] = phi_fwd(A->phi, ur[i]);
}

/* forward of rows q0..q1-1 of batch element b: y[h, d] = sum_k a[h, k] g[d, k] (hyper) or a[h, k] v[h, d, k]
 * (linear); packs b's k, v first unless already packed */
INLINE void forward_rows(const args_t *A, vec *kp, vec *vp, int pack, int b, int q0, int q1, row_t *s, REAL *y,
                         const i64 *ys, const int H, const int NV, const int E, const int D, const int NORM,
                         const int LIN) {
    if (pack) pack_kv(A, b, kp, vp, H, NV, E, D);
    for (int qi = q0; qi < q1; qi++) {
        row_forward(A, kp, vp, b, qi, s, H, NV, E, D, NORM, LIN);
        REAL *yrow = y + b * ys[0] + qi * ys[2];
        for (int h = 0; h < H; h++)
            for (int d0 = 0; d0 < D; d0 += CHUNK) {
                const int n = D - d0 < CHUNK ? D - d0 : CHUNK;
                vec acc[CHUNK];
                for (int d = 0; d < n; d++) acc[d] = (vec){0};
                /* hyper: y[h, d] = sum_k a[h, k] g[d, k]; linear: y[h, d] = sum_k a[h, k] v[h, d, k] */
                const vec *w = LIN ? vp + ((size_t)h * D + d0) * NV : s->g + (size_t)d0 * NV;
                for (int c = 0; c < NV; c++) {
                    const vec ahc = s->a[(size_t)h * NV + c];
                    for (int d = 0; d < n; d++) acc[d] += ahc * w[(size_t)d * NV + c];
                }
                for (int d = 0; d < n; d++) yrow[h * ys[1] + (d0 + d) * ys[3]] = hsum(acc[d]);
            }
    }
}


/* backward of batch element b's rows: packs its k, v, sums its dk, dv in dkp, dvp and writes them out */
INLINE void backward_rows(const args_t *A, const grads_t *G, vec *kp, vec *vp, vec *dkp, vec *dvp, vec *dbp, int b,
                          row_t *s, const int H, const int NV, const int E, const int D, const int NORM,
                          const int LIN) {
    const int KP = NV * VW, Q = A->Q, phi = A->phi;
    pack_kv(A, b, kp, vp, H, NV, E, D);
    memset(dkp, 0, sizeof(vec) * H * E * NV);
    memset(dvp, 0, sizeof(vec) * H * D * NV);
    for (int qi = 0; qi < Q; qi++) {
        row_forward(A, kp, vp, b, qi, s, H, NV, E, D, NORM, LIN);
        const REAL *dyrow = G->dy + b * G->dys[0] + qi * G->dys[2];
        vec dyv[H * D]; /* dy[h, d] of this row, each in all lanes */
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++) dyv[h * D + d] = (vec){0} + dyrow[h * G->dys[1] + d * G->dys[3]];
        if (!LIN) {
            /* through y = a g:  dg[d, k] = sum_h a[h, k] dy[h, d];  da[h, k] = sum_d dy[h, d] g[d, k] */
            head_mix(s->a, dyv, 1, 0, s->du, H, NV, D);
            for (int h = 0; h < H; h++)
                for (int c = 0; c < NV; c++) {
                    vec dac = {0};
                    for (int d = 0; d < D; d++) dac += dyv[h * D + d] * s->g[(size_t)d * NV + c];
                    s->da[(size_t)h * NV + c] = dac;
                }
            /* through g = phi(u) */
            REAL *dur = (REAL *)s->du;
            const REAL *ur = (const REAL *)s->u, *gr = (const REAL *)s->g;
            if (phi == 0)
                for (int i = 0; i < D * KP; i++) dur[i] = ur[i] > 0 ? dur[i] : (REAL)0;
            else
                for (int i = 0; i < D * KP; i++) dur[i] *= phi_grad(phi, ur[i], gr[i]);
        }
        /* through the product with v, w[h, d, k] = du[d, k] (hyper: u = a v) or dy[h, d] (linear: y = a v):
         * da[h, k] += sum_d w[h, d, k] v[h, k, d];  dv[h, d, k] += a[h, k] w[h, d, k]; then through the dropout */
        for (int h = 0; h < H; h++)
            for (int c = 0; c < NV; c++) {
                const vec ahc = s->a[(size_t)h * NV + c];
                vec dac = LIN ? (vec){0} : s->da[(size_t)h * NV + c];
                for (int d = 0; d < D; d++) {
                    const size_t i = ((size_t)h * D + d) * NV + c;
                    const vec w = LIN ? dyv[h * D + d] : s->du[(size_t)d * NV + c];
                    dac += w * vp[i];
                    dvp[i] += ahc * w;
                }
                s->da[(size_t)h * NV + c] = A->drop ? dac * s->dropv[c] : dac;
            }
        if (NORM == NORM_SOFTMAX) { /* ds = an (da - sum_k an da), per head (masked pairs have an = 0) */
            for (int h = 0; h < H; h++) {
                const vec *anh = s->an + (size_t)h * NV, *dah = s->da + (size_t)h * NV;
                vec dot = {0};
                for (int c = 0; c < NV; c++) dot += anh[c] * dah[c];
                const REAL m = hsum(dot);
                for (int c = 0; c < NV; c++) s->ds[(size_t)h * NV + c] = anh[c] * (dah[c] - m);
            }
        } else if (NORM == NORM_RMS) { /* ds = r (da - an m), m = sum_h an da / H; masked pairs: none */
            vec *m = s->u; /* u is no longer needed */
            head_dot(s->an, s->da, m, H, NV);
            for (int c = 0; c < NV; c++) {
                m[c] /= (REAL)H;
                const vec rk = s->r[c] * s->keepv[c];
                for (int h = 0; h < H; h++) {
                    const size_t i = (size_t)h * NV + c;
                    s->ds[i] = rk * (s->da[i] - s->an[i] * m[c]);
                }
            }
        } else {
            for (int h = 0; h < H; h++)
                for (int c = 0; c < NV; c++) s->ds[(size_t)h * NV + c] = s->da[(size_t)h * NV + c] * s->keepv[c];
        }
        /* scores s = scale q.k + bias:  dq[h, e] = scale sum_k ds[h, k] k[h, e, k];  dk[h, e, k] += ds q scale */
        REAL *dqrow = G->dq + b * G->dqs[0] + qi * G->dqs[2];
        for (int h = 0; h < H; h++) {
            const vec *dsh = s->ds + (size_t)h * NV;
            if (dbp) {
                vec *dbh = dbp + ((size_t)h * Q + qi) * NV;
                for (int c = 0; c < NV; c++) dbh[c] += dsh[c];
            }
            for (int e0 = 0; e0 < E; e0 += CHUNK) {
                const int n = E - e0 < CHUNK ? E - e0 : CHUNK;
                vec acc[CHUNK];
                for (int e = 0; e < n; e++) acc[e] = (vec){0};
                for (int c = 0; c < NV; c++) {
                    const vec dsc = dsh[c];
                    for (int e = 0; e < n; e++) {
                        const size_t i = ((size_t)h * E + e0 + e) * NV + c;
                        acc[e] += dsc * kp[i];
                        dkp[i] += dsc * s->qs[h * E + e0 + e];
                    }
                }
                for (int e = 0; e < n; e++) dqrow[h * G->dqs[1] + (e0 + e) * G->dqs[3]] = hsum(acc[e]) * A->scale;
            }
        }
    }
    unpack_grads(A, G, b, dkp, dvp, H, NV, E, D);
}

/* the specialized copies (see above) and the general one */
typedef void (*forward_fn)(const args_t *, vec *, vec *, int, int, int, int, row_t *, REAL *, const i64 *);
typedef void (*backward_fn)(const args_t *, const grads_t *, vec *, vec *, vec *, vec *, vec *, int, row_t *);
#define SPECIALIZE(tag, h, nv, e, d, norm, lin)                                                                    \
    static void forward_##tag(const args_t *A, vec *kp, vec *vp, int pack, int b, int q0, int q1, row_t *s,      \
                              REAL *y, const i64 *ys) {                                                           \
        forward_rows(A, kp, vp, pack, b, q0, q1, s, y, ys, h, nv, e, d, norm, lin);                               \
    }                                                                                                             \
    static void backward_##tag(const args_t *A, const grads_t *G, vec *kp, vec *vp, vec *dkp, vec *dvp, vec *dbp,  \
                               int b, row_t *s) {                                                                 \
        backward_rows(A, G, kp, vp, dkp, dvp, dbp, b, s, h, nv, e, d, norm, lin);                                 \
    }
SPECIALIZE(sraven_hyla, 16, 5, 4, 4, NORM_RMS, 0)
SPECIALIZE(sraven_softmax, 16, 5, 4, 4, NORM_SOFTMAX, 1)
SPECIALIZE(sraven, 16, 5, 4, 4, A->norm, A->linear)
SPECIALIZE(fuzzy_hyla, 8, 4, 2, 2, NORM_RMS, 0)
SPECIALIZE(fuzzy_softmax, 8, 4, 2, 2, NORM_SOFTMAX, 1)
SPECIALIZE(fuzzy, 8, 4, 2, 2, A->norm, A->linear)
SPECIALIZE(any, A->H, A->NV, A->E, A->D, A->norm, A->linear)

/* the copy for A's sizes and variant (fn: forward or backward) */
#define PICK(A, fn)                                                                                                \
    do {                                                                                                          \
        const int hyla_ = (A)->norm == NORM_RMS && !(A)->linear;                                                  \
        const int softmax_ = (A)->norm == NORM_SOFTMAX && (A)->linear;                                            \
        if ((A)->H == 16 && (A)->NV == 5 && (A)->E == 4 && (A)->D == 4)                                           \
            return hyla_ ? fn##_sraven_hyla : softmax_ ? fn##_sraven_softmax : fn##_sraven;                       \
        if ((A)->H == 8 && (A)->NV == 4 && (A)->E == 2 && (A)->D == 2)                                            \
            return hyla_ ? fn##_fuzzy_hyla : softmax_ ? fn##_fuzzy_softmax : fn##_fuzzy;                          \
        return fn##_any;                                                                                          \
    } while (0)

static forward_fn pick_forward(const args_t *A) { PICK(A, forward); }

static backward_fn pick_backward(const args_t *A) { PICK(A, backward); }

static void args_init(args_t *A, const REAL *q, const i64 *qs, const REAL *k, const i64 *ks, const REAL *v,
                      const i64 *vs, const unsigned char *keep, int keep_batched, const unsigned char *drop,
                      REAL keep_prob, int B, int H, int Q, int K, int E, int D, REAL scale, int norm, int linear,
                      REAL eps, int phi) {
    A->B = B; A->H = H; A->Q = Q; A->K = K; A->E = E; A->D = D;
    A->KP = (K + VW - 1) / VW * VW; A->NV = A->KP / VW;
    A->norm = norm; A->linear = linear; A->phi = phi; A->keep_batched = keep_batched;
    A->scale = scale; A->eps = eps; A->keep_prob = keep_prob;
    A->q = q; A->k = k; A->v = v;
    for (int i = 0; i < 4; i++) { A->qs[i] = qs[i]; A->ks[i] = ks[i]; A->vs[i] = vs[i]; }
    A->bias = NULL; A->keep = keep; A->drop = drop;
}

/* bias H x Q x K as H x Q x KP vectors (pads zero); NULL if it cannot be allocated */
static vec *pack_bias(const args_t *A, const REAL *bias) {
    vec *out = (vec *)alloc_aligned(sizeof(vec) * A->H * A->Q * A->NV);
    if (!out) return NULL;
    REAL *o = (REAL *)out;
    memset(o, 0, sizeof(vec) * A->H * A->Q * A->NV);
    for (size_t hq = 0; hq < (size_t)A->H * A->Q; hq++)
        memcpy(o + hq * A->KP, bias + hq * A->K, sizeof(REAL) * A->K);
    return out;
}

/* rows per work unit of the forward when there are few batch elements for the threads */
#define QBLOCK 8

int NAME(hyla_forward)(const REAL *q, const i64 *qs, const REAL *k, const i64 *ks, const REAL *v, const i64 *vs,
                       const REAL *bias, const unsigned char *keep, int keep_batched, const unsigned char *drop,
                       REAL keep_prob, int B, int H, int Q, int K, int E, int D, REAL scale, int norm, int linear,
                       REAL eps, int phi, int threads, REAL *y, const i64 *ys) {
    args_t A;
    args_init(&A, q, qs, k, ks, v, vs, keep, keep_batched, drop, keep_prob, B, H, Q, K, E, D, scale, norm, linear, eps,
              phi);
    if (bias && !(A.bias = pack_bias(&A, bias))) return 1;
    const forward_fn forward = pick_forward(&A);
    /* a unit is a batch element's rows, or a block of them when the batch is small for the threads */
    const int qblock = B >= 4 * threads ? Q : QBLOCK;
    const int blocks = (Q + qblock - 1) / qblock;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        const size_t kv_vectors = (size_t)H * (E + D) * A.NV;
        vec *buf = (vec *)alloc_aligned(sizeof(vec) * (kv_vectors + row_vectors(&A)) + sizeof(REAL) * H * E);
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
        int packed_b = -1;
#pragma omp for schedule(static)
        for (long unit = 0; unit < (long)B * blocks; unit++) {
            if (!buf) continue;
            const int b = (int)(unit / blocks), q0 = (int)(unit % blocks) * qblock;
            const int q1 = q0 + qblock < Q ? q0 + qblock : Q;
            vec *kp = buf, *vp = kp + (size_t)H * E * A.NV;
            row_t s;
            row_bind(&A, buf + kv_vectors, (REAL *)(buf + kv_vectors + row_vectors(&A)), &s);
            forward(&A, kp, vp, b != packed_b, b, q0, q1, &s, y, ys);
            packed_b = b;
        }
        free(buf);
    }
    free((void *)A.bias);
    return failed;
}

int NAME(hyla_backward)(const REAL *q, const i64 *qs, const REAL *k, const i64 *ks, const REAL *v, const i64 *vs,
                        const REAL *bias, const unsigned char *keep, int keep_batched, const unsigned char *drop,
                        REAL keep_prob, int B, int H, int Q, int K, int E, int D, REAL scale, int norm, int linear,
                        REAL eps, int phi, int threads, const REAL *dy, const i64 *dys, REAL *dq, const i64 *dqs, REAL *dk,
                        const i64 *dks, REAL *dv, const i64 *dvs, REAL *dbias) {
    args_t A;
    args_init(&A, q, qs, k, ks, v, vs, keep, keep_batched, drop, keep_prob, B, H, Q, K, E, D, scale, norm, linear, eps,
              phi);
    grads_t G;
    G.dy = dy; G.dq = dq; G.dk = dk; G.dv = dv;
    for (int i = 0; i < 4; i++) { G.dys[i] = dys[i]; G.dqs[i] = dqs[i]; G.dks[i] = dks[i]; G.dvs[i] = dvs[i]; }
    if (bias && !(A.bias = pack_bias(&A, bias))) return 1;
    const backward_fn backward = pick_backward(&A);
    const int NV = A.NV, KP = A.KP;
    const size_t bias_vectors = dbias ? (size_t)H * Q * NV : 0;
    vec *dbias_parts = dbias ? (vec *)alloc_aligned(sizeof(vec) * bias_vectors * threads) : NULL;
    if (dbias && !dbias_parts) {
        free((void *)A.bias);
        return 1;
    }
    if (dbias_parts) memset(dbias_parts, 0, sizeof(vec) * bias_vectors * threads);
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        /* packed k, v and their gradients' sums over the batch element's queries, then a row's scratch */
        const size_t kv_vectors = (size_t)H * (E + D) * NV;
        vec *buf = (vec *)alloc_aligned(sizeof(vec) * (2 * kv_vectors + row_vectors(&A)) + sizeof(REAL) * H * E);
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
        vec *dbp = dbias_parts ? dbias_parts + (size_t)tid * bias_vectors : NULL;
        /* a batch element's rows stay on one thread: dk and dv sum over its queries */
#pragma omp for schedule(static)
        for (int b = 0; b < B; b++) {
            if (!buf) continue;
            vec *kp = buf, *vp = kp + (size_t)H * E * NV, *dkp = vp + (size_t)H * D * NV, *dvp = dkp + (size_t)H * E * NV;
            row_t s;
            row_bind(&A, buf + 2 * kv_vectors, (REAL *)(buf + 2 * kv_vectors + row_vectors(&A)), &s);
            backward(&A, &G, kp, vp, dkp, dvp, dbp, b, &s);
        }
        free(buf);
    }
    if (dbias && !failed) { /* the threads' partial sums, in thread order */
        const REAL *parts = (const REAL *)dbias_parts;
        for (size_t hq = 0; hq < (size_t)H * Q; hq++)
            for (int j = 0; j < K; j++) {
                REAL acc = 0;
                for (int t = 0; t < threads; t++) acc += parts[((size_t)t * H * Q + hq) * KP + j];
                dbias[hq * K + j] = acc;
            }
    }
    free(dbias_parts);
    free((void *)A.bias);
    return failed;
}

/* ---------------------------------------------------------------------------------------------------------
 * GELU with the tanh approximation (the paper configs' feed-forward, flax's nn.gelu), elementwise over n
 * contiguous values: y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed as its equal
 * y = x s with s = sigmoid(2u) = (1 + tanh(u)) / 2, from e = exp(-2|u|) <= 1 (vexp's range):
 * s = 1 / (1 + e) where u >= 0, e / (1 + e) where u < 0, and 1 - s likewise, so that neither side cancels.
 * Gradient: dy/dx = s + 2 x s (1 - s) u'(x), u'(x) = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
 * Every element goes through the same vector arithmetic (the tail is padded into one vector), so a value's
 * result does not depend on its position or on n. */
#define GELU_BETA ((REAL)0.79788456080286535588) /* sqrt(2 / pi) */
#define GELU_KAPPA ((REAL)0.044715)
#define GELU_CHUNK 4096 /* elements per OpenMP work unit */

/* s and 1 - s for the lanes of x, with u'(x) when du is not NULL */
static inline void gelu_sigmoids(vec x, vec *s, vec *one_minus_s, vec *du) {
    const vec x2 = x * x;
    const vec u = GELU_BETA * (x + GELU_KAPPA * (x2 * x));
    const vmask neg = u < (vec){0};
    const vec abs_u = (vec)(((vmask)u & ~neg) | ((vmask)((vec){0} - u) & neg));
    const vec e = vexp((REAL)-2 * abs_u);
    const vec inv = (REAL)1 / ((REAL)1 + e);
    const vec e_inv = e * inv;
    *s = (vec)(((vmask)inv & ~neg) | ((vmask)e_inv & neg));
    *one_minus_s = (vec)(((vmask)e_inv & ~neg) | ((vmask)inv & neg));
    if (du) *du = GELU_BETA * ((REAL)1 + ((REAL)3 * GELU_KAPPA) * x2);
}

static inline vec gelu_fwd_vec(vec x) {
    vec s, t;
    gelu_sigmoids(x, &s, &t, NULL);
    return x * s;
}

static inline vec gelu_bwd_vec(vec x, vec dy) {
    vec s, t, du;
    gelu_sigmoids(x, &s, &t, &du);
    return dy * (s + (REAL)2 * x * (s * t) * du);
}

static inline vec load_vec(const REAL *p, long m) { /* m <= VW values, the rest zero */
    vec v = {0};
    if (m == VW) memcpy(&v, p, sizeof(vec)); /* a constant size: one vector load */
    else memcpy(&v, p, sizeof(REAL) * (size_t)m);
    return v;
}

static inline void store_vec(REAL *p, vec v, long m) {
    if (m == VW) memcpy(p, &v, sizeof(vec));
    else memcpy(p, &v, sizeof(REAL) * (size_t)m);
}

/* the OpenMP work units of an elementwise pass over n values: [begin, end) of unit */
#define GELU_UNITS(n) (((n) + GELU_CHUNK - 1) / GELU_CHUNK)
#define GELU_END(unit, n) ((unit + 1) * GELU_CHUNK < (n) ? (unit + 1) * GELU_CHUNK : (n))

void NAME(gelu_tanh_forward)(const REAL *x, REAL *y, i64 n, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (i64 unit = 0; unit < GELU_UNITS(n); unit++) {
        const i64 end = GELU_END(unit, n);
        for (i64 i = unit * GELU_CHUNK; i < end; i += VW) {
            const long m = end - i < VW ? (long)(end - i) : VW;
            store_vec(y + i, gelu_fwd_vec(load_vec(x + i, m)), m);
        }
    }
}

void NAME(gelu_tanh_backward)(const REAL *x, const REAL *dy, REAL *dx, i64 n, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (i64 unit = 0; unit < GELU_UNITS(n); unit++) {
        const i64 end = GELU_END(unit, n);
        for (i64 i = unit * GELU_CHUNK; i < end; i += VW) {
            const long m = end - i < VW ? (long)(end - i) : VW;
            store_vec(dx + i, gelu_bwd_vec(load_vec(x + i, m), load_vec(dy + i, m)), m);
        }
    }
}
