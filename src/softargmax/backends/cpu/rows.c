/* Fused per-row threshold solvers for the CPU (softargmax.backends.cpu.rows builds and loads this file).
 *
 * Each row of a contiguous [R, k] matrix z is solved in one call, with no temporary
 * [R, k] tensors: the row maximum, the candidates and every Newton step stay in the
 * thread's cache.  The iteration is in double; p, s (the Jacobian weights g') and the
 * per-row tau and sum(s) are written in the input's type.  Rows are spread over OpenMP
 * threads (the runtime is the one torch already loaded: same soname).  Reductions are
 * vectorized with `omp simd`; with SA_VECTOR_MATH, exp and log are the vector versions
 * of glibc's libmvec (max 4 ulp).
 *
 * Row status: 0 solved, 1 every entry is -inf (p = s = 0), 2 the row has NaN or +inf
 * (p = NaN, s = 0, tau = NaN): the conventions of softargmax.threshold.
 *
 * Kinds (with q = 1; KIND_POWER also with weights q_j, a reference measure):
 *   KIND_POWER  sum_j q_j [y_j - t]_+^{1/a} = 1 with y = a z, a in (0, 1]: alpha-entmax
 *               (a = alpha - 1; a = 1 is sparsemax).  Newton on S^a (the 1/a-norm of
 *               [y - t]_+, convex and decreasing in t) from t = max y - 1 increases
 *               monotonically to the root, so an entry with y_j <= t is dropped for good
 *               and the candidate list shrinks every pass.  a = 1: Michelot's step (the
 *               root of the linear equation on the candidates, also below the root),
 *               exact once no candidate is dropped.  a = 1/2: a Newton step, unless the
 *               quadratic's root on the candidates keeps all of them positive and is
 *               >= t, which makes it the exact root.  Returned tau: t in the variable y.
 * and the dense kinds (f'(0) = -inf: every pass is over the whole row), g(v) = (f*)'(v), with
 * Newton on (S^rho - 1)/rho (log S at rho = 0), convex in t, so that the steps increase
 * monotonically to the root from a lower bound (dense_start):
 *   KIND_JS     Jensen-Shannon, g(v) = 1/(2 e^{-v} - 1), rho = 0.
 *   KIND_HELL   squared Hellinger, g(v) = (1 - v)^{-2}, rho = -1/2.
 *   KIND_RKL    reverse KL, g(v) = -1/v, rho = -1.
 *   KIND_JEFF   Jeffrey, g(v) = 1/W(e^{1 - v}) (Lambert W), rho = -1/2.
 *   KIND_RCHI   reverse chi-square, g(v) = (-2v)^{-1/2}, rho = -2.
 * Returned tau of the dense kinds: tau itself.
 * Jeffrey's Lambert W: Robert M. Corless, Gaston H. Gonnet, David E. G. Hare, David J. Jeffrey and
 * Donald E. Knuth, "On the Lambert W Function", Advances in Computational Mathematics 5, 1996,
 * https://doi.org/10.1007/BF02124750 (the asymptotic series, eq. 4.19); F. N. Fritsch, R. E. Shafer
 * and W. P. Crowley, "Algorithm 443: Solution of the transcendental equation w e^w = x",
 * Communications of the ACM 16, 1973, https://doi.org/10.1145/361952.361970 (the iteration).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef SA_VECTOR_MATH
#pragma omp declare simd notinbranch
double exp(double);
#pragma omp declare simd notinbranch
double log(double);
#pragma omp declare simd notinbranch
float logf(float);
#pragma omp declare simd notinbranch
double pow(double, double);
#endif

/* b^e for b > 0 as exp(e log b), libmvec's vector exp and log (a float64 alpha-ReLU pass of 2^20
   entries: 2.2 ms, 2.7 with its vector pow): the relative error grows with |e ln b| (log b's rounding
   scaled by e ln b): hundreds of double ulps where it is large (e = 100, b = 1e3), far below a
   float's rounding (29 more bits), not for a double result, which takes pow (libmvec's vector pow,
   within an ulp here; libm's without libmvec) */
#pragma omp declare simd notinbranch
static inline double pow_pos(double b, double e) { return exp(e * log(b)); }

#define KIND_POWER 0
#define KIND_JS 1
#define KIND_HELL 2
#define KIND_RKL 3
#define KIND_JEFF 4
#define KIND_RCHI 5
#define MAX_ITER 200
#define BLOCK 16
/* candidate lists are padded with -inf to a multiple of this (a vector-math call for a
   short list would otherwise fall into the scalar remainder loop) */
#define PAD 8

/* Newton/Michelot on the candidates d[0..n) (shifted: the largest is 0, all > t_start), from t_start,
 * a lower bound of the root (-1, or the root of a subset of the row's entries).
 * Returns t; *n becomes the support size, d/idx its entries.  For a not in {1, 1/2},
 * w_out[0..n) holds g' = (d - t)^{1/a - 1} at the returned t (every exit follows a pass).
 * weighted: the sums are sum_j c_j [d_j - t]_+^{1/a} with the weights c[0..n) (a reference measure q,
 * compacted with d; c has room for the padding), t_start a lower bound of that root; the same
 * iteration (the weighted 1/a-norm of [d - t]_+ is convex and decreasing in t too).  Inlined with a
 * constant flag: iterate_power and iterate_power_weighted below. */
static inline __attribute__((always_inline)) double iterate_power_impl(
        double *d, double *w_out, double *c, int32_t *idx, long *n_io, double a, double tol, int *iters,
        double t_start, const int weighted) {
    const double ex = 1.0 / a - 1.0;
    long n = *n_io;
    double t = t_start, last = INFINITY;
    int it = 0;
    for (;;) {
        if (a == 0.5) { /* compaction and the quadratic's sums in one pass over the candidates */
            /* four partial sums: one chain of dependent additions would wait on each add's latency;
               s0: the candidates' weight (their count unweighted) */
            double s0v[4] = {0, 0, 0, 0}, s1v[4] = {0, 0, 0, 0}, s2v[4] = {0, 0, 0, 0};
            double dminv[4] = {INFINITY, INFINITY, INFINITY, INFINITY};
            long w = 0, i = 0;
            for (; i + 4 <= n; i += 4) {
                for (int l = 0; l < 4; l++) {
                    const double v = d[i + l];
                    const int32_t j = idx[i + l];
                    const int keep = v > t;
                    const double cw = weighted ? c[i + l] : 1.0;
                    const double ck = keep ? cw : 0.0, vk = keep ? v : 0.0;
                    d[w] = v; idx[w] = j;
                    if (weighted) c[w] = cw;
                    w += keep;
                    if (weighted) s0v[l] += ck;
                    s1v[l] += ck * vk;
                    s2v[l] += ck * vk * vk;
                    dminv[l] = keep && v < dminv[l] ? v : dminv[l];
                }
            }
            for (; i < n; i++) {
                const double v = d[i];
                const int32_t j = idx[i];
                const int keep = v > t;
                const double cw = weighted ? c[i] : 1.0;
                const double ck = keep ? cw : 0.0, vk = keep ? v : 0.0;
                d[w] = v; idx[w] = j;
                if (weighted) c[w] = cw;
                w += keep;
                if (weighted) s0v[0] += ck;
                s1v[0] += ck * vk;
                s2v[0] += ck * vk * vk;
                dminv[0] = keep && v < dminv[0] ? v : dminv[0];
            }
            const double s1 = (s1v[0] + s1v[1]) + (s1v[2] + s1v[3]);
            const double s2 = (s2v[0] + s2v[1]) + (s2v[2] + s2v[3]);
            const double dmin = fmin(fmin(dminv[0], dminv[1]), fmin(dminv[2], dminv[3]));
            n = w;
            const double s0 = weighted ? (s0v[0] + s0v[1]) + (s0v[2] + s0v[3]) : (double)n;
            const double mean = s1 / s0;
            const double disc = mean * mean - (s2 - 1.0) / s0;
            const double tc = mean - sqrt(disc > 0 ? disc : 0.0);
            if (disc >= 0 && tc >= t && tc < dmin) { t = tc; it++; break; }
            const double P = s1 - s0 * t;
            const double S = s2 - 2.0 * t * s1 + s0 * t * t;
            const double resid = fabs(S - 1.0);
            if (resid <= tol || (it > 1 && resid >= last)) break;
            last = resid;
            const double tn = t + (S - sqrt(S)) / P;
            if (!(tn > t) || it >= MAX_ITER) break;
            t = tn;
            it++;
            continue;
        }
        long w = 0;
        for (long i = 0; i < n; i++) { /* branch-free compaction */
            const double v = d[i];
            const int32_t j = idx[i];
            d[w] = v; idx[w] = j;
            if (weighted) c[w] = c[i];
            w += v > t;
        }
        const long dropped = n - w;
        n = w;
        double tn;
        if (a == 1.0) {
            if (it > 0 && dropped == 0) break; /* t was solved on exactly this support */
            double s1 = 0, s0 = 0;
            if (weighted) {
#pragma omp simd reduction(+ : s0, s1)
                for (long i = 0; i < n; i++) { s0 += c[i]; s1 += c[i] * d[i]; }
            } else {
#pragma omp simd reduction(+ : s1)
                for (long i = 0; i < n; i++) s1 += d[i];
                s0 = (double)n;
            }
            tn = (s1 - 1.0) / s0;
            if (!(tn > t) && it > 0) break;
        } else {
            double S = 0, P = 0;
            {
                const long np = (n + PAD - 1) / PAD * PAD;
                for (long i = n; i < np; i++) d[i] = -INFINITY;
                if (weighted)
                    for (long i = n; i < np; i++) c[i] = 0.0;
                /* three simple loops, each vectorized (GCC 12 left the single loop that tested,
                   powered and summed scalar, calling the scalar exp and log): the bases (padding
                   slots and dropped entries evaluate 1^ex and are zeroed by a product, not a select,
                   which would let the compiler pass log a 0: a slow special case), their powers,
                   then the mask and the sums */
#pragma omp simd
                for (long i = 0; i < np; i++) {
                    const double b = d[i] - t;
                    w_out[i] = b > 0 ? b : 1.0;
                }
#pragma omp simd
                for (long i = 0; i < np; i++) w_out[i] = pow_pos(w_out[i], ex);
#pragma omp simd reduction(+ : S, P)
                for (long i = 0; i < np; i++) {
                    const double b = d[i] - t;
                    const double gp = w_out[i] * (b > 0 ? 1.0 : 0.0);
                    const double cg = weighted ? c[i] * gp : gp;
                    w_out[i] = gp;
                    S += cg * (b > 0 ? b : 0.0);
                    P += cg;
                }
            }
            const double resid = fabs(S - 1.0);
            if (resid <= tol || (it > 1 && resid >= last)) break;
            last = resid;
            tn = t + (S - pow(S, 1.0 - a)) / P;
            if (!(tn > t)) break;
        }
        if (it >= MAX_ITER) break;
        t = tn;
        it++;
    }
    *n_io = n;
    *iters = it;
    return t;
}

/* q^{-a}, the start's distance from an entry of weight q (a square root at a = 1/2, a division at a = 1) */
static inline double weight_power(double q, double a) {
    return a == 0.5 ? 1.0 / sqrt(q) : a == 1.0 ? 1.0 / q : pow_pos(q, -a);
}

static double iterate_power(double *d, double *w_out, int32_t *idx, long *n_io, double a, double tol,
                            int *iters, double t_start) {
    return iterate_power_impl(d, w_out, NULL, idx, n_io, a, tol, iters, t_start, 0);
}

static double iterate_power_weighted(double *d, double *w_out, double *c, int32_t *idx, long *n_io, double a,
                                     double tol, int *iters, double t_start) {
    return iterate_power_impl(d, w_out, c, idx, n_io, a, tol, iters, t_start, 1);
}

/* -- the dense kinds (f'(0) = -inf: every entry is in the support) -------------------------------- */

/* S(t_lo) >= 1: the row maximum's own term g(-t_lo) = 1, t_lo = -f'(1) */
static double dense_t_lo(int kind) {
    return kind == KIND_RKL ? 1.0 : kind == KIND_RCHI ? 0.5 : 0.0;
}

/* A lower bound of the root from two row sums a1, a2 of the first pass, or -inf.  Jensen's (g is
   convex, so S(t) >= nf g(-t - mean e) over the nf finite entries; a1 = the sum of their e, a2 = nf):
   the t where nf g(-t - mean e) = 1.  JS (a1 = sum y, a2 = sum y^2, y = exp(z - m)): g(v) >= x + x^2
   with x = e^v / 2, so S(t) >= X a1 + X^2 a2 with X = e^{-t} / 2, which is 1 at
   t = log((a1 + sqrt(a1^2 + 4 a2)) / 4). */
static double dense_start(int kind, double a1, double a2) {
    switch (kind) {
    case KIND_JS: return log(0.25 * (a1 + sqrt(a1 * a1 + 4.0 * a2)));
    case KIND_HELL: return sqrt(a2) - 1.0 - a1 / a2;
    case KIND_RKL: return a2 - a1 / a2;
    case KIND_RCHI: return 0.5 * a2 * a2 - a1 / a2;
    case KIND_JEFF: return a2 + log(a2) - 1.0 - a1 / a2;
    default: return -INFINITY;
    }
}

/* The Newton step t + phi / |phi'| on phi = (S^rho - 1)/rho (log S at rho = 0), convex in t for each
   kind (Sp = -S' = the sum of g'), so that the steps increase monotonically to the root from below. */
static double dense_step(int kind, double t, double S, double Sp) {
    switch (kind) {
    case KIND_JS: return t + S * log(S) / Sp;               /* rho = 0 */
    case KIND_RKL: return t + (S * S - S) / Sp;             /* rho = -1 */
    case KIND_RCHI: return t + (S * S * S - S) / (2.0 * Sp); /* rho = -2 */
    default: return t + 2.0 * (S * sqrt(S) - S) / Sp;       /* rho = -1/2: Hellinger, Jeffrey */
    }
}

/* Jeffrey: g(v) = 1/W(e^{1 - v}), with W(e^L) for L = 1 + t + e_j >= 1 (so W >= 1), the root w of
   w + log w = L.  The pass clamps e at JEFF_BIG, where g' = 1/(W (1 + W)) overflows to 0 and so
   does g = (1 + W) g': masked entries give 0 with no select (a select in a loop with a vector-math
   call keeps GCC 12 from vectorizing it), and so do entries more than ~1e154 below the row maximum
   (g < 1e-154 there).  Each pass evaluates W in one of three ways (jeffrey_mode), all exact to the
   double's rounding (the tests check them against a 50-digit reference):
   JEFF_COLD   the asymptotic start L - log L + log L / L (exact at L = 1, 8% off at worst, near
               L = 1.5) and two Fritsch steps (three logs);
   JEFF_WARM   the previous pass's W, a second-order Taylor step in the change dt of t and one
               Fritsch step (one log), where jeffrey_mode finds the Taylor step's error small;
   JEFF_SERIES every L >= JEFF_SERIES_MIN (t large: long flat rows): the asymptotic series of
               Corless et al. (1996, eq. 4.19) to L^-5, relative error below 1e-18 (one log).  In
               float rows with every L below JEFF_NARROW, W - L = -log L + ... is computed in
               float (eight lanes instead of four; jeffrey_dw_float) and added to L in double:
               logf's error, 4 ulp of log L <= 70, the rounding of L and of the terms change W,
               >= 993, by 3e-9 of itself at most (float's rounding: 6e-8). */
#define JEFF_BIG 1e300
#define JEFF_COLD 0
#define JEFF_WARM 1
#define JEFF_SERIES 2
#define JEFF_SERIES_MIN 1000.0
#define JEFF_NARROW 1e30
/* Jeffrey's g = 1/x and g' = 1/(x (1 + x)) from x = W(e^{t + 1 + m - z_j}), stored in p[j], s[j] and summed
   (the statement that ends each of the Jeffrey pass's loops, which differ in how they get x) */
#define JEFF_PUT(T, x)                                                                               \
    const double gp_ = 1.0 / ((x) * (1.0 + (x))), g_ = (1.0 + (x)) * gp_;                           \
    p[j] = (T)g_; s[j] = (T)gp_; S += g_; Sp += gp_

/* One step of Fritsch's iteration (Fritsch, Shafer and Crowley, 1973): from a relative error e
   to about e^4 / 100 (8e-2 -> 3e-7 -> below the double's rounding), in a form scaled by 1/(1 + w)
   that does not overflow for w up to JEFF_BIG.  Inlined, not "declare simd": GCC 12 runs a simd
   clone's lanes one by one through the scalar log. */
static inline __attribute__((always_inline)) double fritsch_step(double w, double L) {
    const double r = 1.0 / (1.0 + w);
    const double a = (L - log(w) - w) * r, b = a * r;
    const double q = 2.0 + (4.0 / 3.0) * a;
    return w + w * a * (q - b) / (q - 2.0 * b);
}

static inline __attribute__((always_inline)) double jeffrey_w_cold(double L) {
    const double lL = log(L);
    const double x = L - lL + lL / L;
    return fritsch_step(fritsch_step(x, L), L);
}

/* from x = W(e^{L - dt}): W' = x/(1 + x), W'' = x/(1 + x)^3 */
static inline __attribute__((always_inline)) double jeffrey_w_warm(double x, double dt, double L) {
    const double d = 1.0 / (1.0 + x);
    return fritsch_step(x + dt * x * d * (1.0 + 0.5 * dt * d * d), L);
}

/* the series from l = log L and u = 1/L; its coefficients are multiplied by constant reciprocals (a division by
   a constant is not turned into a product without -freciprocal-math, and divisions cost this loop
   most of its time) */
static inline __attribute__((always_inline)) double jeffrey_w_series_lu(double L, double l, double u) {
    const double c2 = (6.0 + l * (-9.0 + 2.0 * l)) * (1.0 / 6.0);
    const double c3 = (-12.0 + l * (36.0 + l * (-22.0 + 3.0 * l))) * (1.0 / 12.0);
    const double c4 = (60.0 + l * (-300.0 + l * (350.0 + l * (-125.0 + 12.0 * l)))) * (1.0 / 60.0);
    return (L - l) + u * l * (1.0 + u * (0.5 * (l - 2.0) + u * (c2 + u * (c3 + u * c4))));
}

static inline __attribute__((always_inline)) double jeffrey_w_series(double L) {
    return jeffrey_w_series_lu(L, log(L), 1.0 / L);
}

/* W(e^L) - L in float for float rows (L < JEFF_NARROW, in the series' range): -log L plus the series'
   terms to L^-3 (their truncation: 1e-13 of W), eight lanes at a time; W is then L plus this in double */
static inline __attribute__((always_inline)) float jeffrey_dw_float(float L) {
    const float l = logf(L), u = 1.0f / L;
    const float c2 = (6.0f + l * (-9.0f + 2.0f * l)) * (1.0f / 6.0f);
    return u * l * (1.0f + u * (0.5f * (l - 2.0f) + u * c2)) - l;
}

/* How the pass at t evaluates W after a step dt from a pass in mode prev (-1: the row's first pass;
   a series pass keeps no W for a warm start).  The warm start's Taylor step has relative error below
   |W^(3)| |dt|^3 / (6 W) <= |dt|^3 / (200 W) <= 2.5e-6 when |dt|^3 <= 5e-4 W (W >= 1 + t - log(1 + t)
   for every entry), which one Fritsch step takes below 1e-20. */
static int jeffrey_mode(double t, double dt, int prev) {
    if (1.0 + t >= JEFF_SERIES_MIN) return JEFF_SERIES;
    if (prev != JEFF_COLD && prev != JEFF_WARM) return JEFF_COLD;
    const double wlo = fmax(1.0, 1.0 + t - log1p(t));
    return fabs(dt * dt * dt) <= 5e-4 * wlo ? JEFF_WARM : JEFF_COLD;
}

/* W(e^L) for n arguments L in [1, JEFF_BIG] as a Jeffrey pass computes them in mode (the tests'
   entry; prev and dt: the warm start's, prev may be NULL otherwise; mode JEFF_SERIES + 1: the series
   from the float log of float rows, L < JEFF_NARROW). */
void sa_jeffrey_w(const double *L, const double *prev, double dt, int mode, double *out, long n) {
    for (long j = 0; j < n; j++)
        out[j] = mode == JEFF_SERIES + 1 ? L[j] + (double)jeffrey_dw_float((float)L[j])
                 : mode == JEFF_SERIES ? jeffrey_w_series(L[j])
                 : mode == JEFF_WARM ? jeffrey_w_warm(prev[j], dt, L[j]) : jeffrey_w_cold(L[j]);
}

#define DEFINE_DENSE(T, SUFFIX, EPS)                                                                 \
/* The row maximum, minimum and sum (and *bad set if the row has NaN or +inf), with no select: a select \
   on the entries' finiteness made this pass seven times slower (GCC 12); rows with masked entries   \
   (sum -inf) take the sums of their finite entries in a second pass (dense_sums). */                \
static double row_stats_##SUFFIX(const T *z, long k, int *bad, double *sz_out, double *zmin_out) {   \
    T mx = -INFINITY, mn = INFINITY;                                                                 \
    int b = 0;                                                                                       \
    double sz = 0;                                                                                   \
    _Pragma("omp simd reduction(max : mx) reduction(min : mn) reduction(| : b) reduction(+ : sz)")   \
    for (long j = 0; j < k; j++) {                                                                   \
        const T v = z[j];                                                                            \
        b |= (v != v) | (v == (T)INFINITY);                                                          \
        mx = v > mx ? v : mx;                                                                        \
        mn = v < mn ? v : mn;                                                                        \
        sz += (double)v;                                                                             \
    }                                                                                                \
    *bad = b;                                                                                        \
    *sz_out = sz;                                                                                    \
    *zmin_out = (double)mn;                                                                          \
    return (double)mx;                                                                               \
}                                                                                                    \
                                                                                                     \
/* Jensen's sums over the finite entries: *a1 = the sum of m - z_j, *a2 = their count */             \
static void dense_sums_##SUFFIX(const T *z, long k, double m, double *a1_out, double *a2_out) {      \
    double a1 = 0, a2 = 0;                                                                           \
    _Pragma("omp simd reduction(+ : a1, a2)")                                                        \
    for (long j = 0; j < k; j++) {                                                                   \
        const double v = m - (double)z[j];                                                           \
        const int fin = v < INFINITY;                                                                \
        a1 += fin ? v : 0.0; a2 += fin ? 1.0 : 0.0;                                                  \
    }                                                                                                \
    *a1_out = a1;                                                                                    \
    *a2_out = a2;                                                                                    \
}                                                                                                    \
                                                                                                     \
/* One pass of a dense kind at t (tau - m): g and g' of every entry, written to p and s in T as the  \
   output of this t (the last pass's are the result: no pass after the iteration), and their sums    \
   *S and *Sp in double.  The entries' e_j = m - z_j >= 0 (+inf where masked: g = g' = 0) are computed \
   from z, except: JS reads e = y = exp(z - m) <= 1 (0 where masked) from the first pass; Jeffrey    \
   reads e = m - z clamped at JEFF_BIG (where g = g' = 0) when e is not NULL (rows with masked or    \
   huge entries, and every cold or warm pass), and evaluates W(e^{1 + t + e_j}) as jmode says        \
   (jeffrey_mode): w[j] holds the previous cold or warm pass's and receives this one's (dt: t's change \
   since then); narrow (e NULL): T is float and every 1 + t + e_j < JEFF_NARROW. */                  \
static void eval_dense_##SUFFIX(const T *z, double m, const double *e, double *w, long k, int kind, double t, \
                              double dt, int jmode, int narrow, T *p, T *s, double *S_out, double *Sp_out) { \
    double S = 0, Sp = 0;                                                                            \
    if (kind == KIND_JS) { /* g = 1/(2 e^{t - v} - 1) = y/(2 e^t - y) */                             \
        const double c = 2.0 * exp(t);                                                               \
        _Pragma("omp simd reduction(+ : S, Sp)")                                                     \
        for (long j = 0; j < k; j++) {                                                               \
            const double g = e[j] / (c - e[j]), gp = g + g * g;                                      \
            p[j] = (T)g; s[j] = (T)gp; S += g; Sp += gp;                                             \
        }                                                                                            \
    } else if (kind == KIND_HELL) {                                                                  \
        const double t1 = t + 1.0;                                                                   \
        _Pragma("omp simd reduction(+ : S, Sp)")                                                     \
        for (long j = 0; j < k; j++) {                                                               \
            const double r = 1.0 / (t1 + (m - (double)z[j])), g = r * r, gp = 2.0 * g * r;           \
            p[j] = (T)g; s[j] = (T)gp; S += g; Sp += gp;                                             \
        }                                                                                            \
    } else if (kind == KIND_RKL) {                                                                   \
        _Pragma("omp simd reduction(+ : S, Sp)")                                                     \
        for (long j = 0; j < k; j++) {                                                               \
            const double g = 1.0 / (t + (m - (double)z[j])), gp = g * g;                             \
            p[j] = (T)g; s[j] = (T)gp; S += g; Sp += gp;                                             \
        }                                                                                            \
    } else if (kind == KIND_RCHI) {                                                                  \
        const double t2 = 2.0 * t;                                                                   \
        _Pragma("omp simd reduction(+ : S, Sp)")                                                     \
        for (long j = 0; j < k; j++) {                                                               \
            const double g = 1.0 / sqrt(t2 + 2.0 * (m - (double)z[j])), gp = g * g * g;              \
            p[j] = (T)g; s[j] = (T)gp; S += g; Sp += gp;                                             \
        }                                                                                            \
    } else {                                                                                         \
        const double t1 = t + 1.0;                                                                   \
        if (jmode == JEFF_SERIES && narrow) { /* W - L in float (eight lanes), staged in p (T is float) */ \
            _Pragma("omp simd")                                                                      \
            for (long j = 0; j < k; j++) p[j] = (T)jeffrey_dw_float((float)(t1 + (m - (double)z[j]))); \
            _Pragma("omp simd reduction(+ : S, Sp)")                                                 \
            for (long j = 0; j < k; j++) {                                                           \
                const double x = (t1 + (m - (double)z[j])) + (double)p[j];                           \
                JEFF_PUT(T, x);                                                                      \
            }                                                                                        \
        } else if (jmode == JEFF_SERIES && !e) {                                                     \
            _Pragma("omp simd reduction(+ : S, Sp)")                                                 \
            for (long j = 0; j < k; j++) {                                                           \
                const double x = jeffrey_w_series(t1 + (m - (double)z[j]));                          \
                JEFF_PUT(T, x);                                                                      \
            }                                                                                        \
        } else if (jmode == JEFF_SERIES) {                                                           \
            _Pragma("omp simd reduction(+ : S, Sp)")                                                 \
            for (long j = 0; j < k; j++) {                                                           \
                const double x = jeffrey_w_series(t1 + e[j]);                                        \
                JEFF_PUT(T, x);                                                                      \
            }                                                                                        \
        } else if (jmode == JEFF_WARM) {                                                             \
            _Pragma("omp simd reduction(+ : S, Sp)")                                                 \
            for (long j = 0; j < k; j++) {                                                           \
                const double x = jeffrey_w_warm(w[j], dt, t1 + e[j]);                                \
                w[j] = x;                                                                            \
                JEFF_PUT(T, x);                                                                      \
            }                                                                                        \
        } else {                                                                                     \
            _Pragma("omp simd reduction(+ : S, Sp)")                                                 \
            for (long j = 0; j < k; j++) {                                                           \
                const double x = jeffrey_w_cold(t1 + e[j]);                                          \
                w[j] = x;                                                                            \
                JEFF_PUT(T, x);                                                                      \
            }                                                                                        \
        }                                                                                            \
    }                                                                                                \
    *S_out = S;                                                                                      \
    *Sp_out = Sp;                                                                                    \
}                                                                                                    \
                                                                                                     \
/* Jeffrey's e = m - z clamped at JEFF_BIG (a separate loop: see JEFF_BIG) */                        \
static void jeffrey_e_##SUFFIX(const T *z, double m, long k, double *e) {                            \
    _Pragma("omp simd")                                                                              \
    for (long j = 0; j < k; j++) {                                                                   \
        const double v = m - (double)z[j];                                                           \
        e[j] = v < JEFF_BIG ? v : JEFF_BIG;                                                          \
    }                                                                                                \
}                                                                                                    \
                                                                                                     \
/* The Newton iteration of a dense kind from t0 (a lower bound of the root, or above it by a rounding \
   error: then the first step goes down, not below t_lo); p, s and *ssum are those of the last pass. \
   e: as eval_dense reads it (ebuf: where Jeffrey's is written when a pass needs it); emax: the largest \
   e_j (+inf: some entry is masked). */                                                              \
static double iterate_dense_##SUFFIX(const T *z, double m, const double *e, double *ebuf, double *w, long k, \
                                   int kind, double tol, double t0, double t_lo, double emax, T *p, T *s, \
                                   T *ssum, int *iters) {                                            \
    double t = t0, last = INFINITY, dt = 0, S = 0, Sp = 0;                                           \
    int it = 0, jmode = kind == KIND_JEFF ? jeffrey_mode(t0, 0.0, -1) : 0;                           \
    for (;;) {                                                                                       \
        if (kind == KIND_JEFF && !e && (jmode != JEFF_SERIES || !(emax < JEFF_BIG))) {               \
            jeffrey_e_##SUFFIX(z, m, k, ebuf);                                                       \
            e = ebuf;                                                                                \
        }                                                                                            \
        const int narrow = sizeof(T) == sizeof(float) && !e && 1.0 + t + emax < JEFF_NARROW;         \
        eval_dense_##SUFFIX(z, m, e, w, k, kind, t, dt, jmode, narrow, p, s, &S, &Sp);               \
        const double resid = fabs(S - 1.0);                                                          \
        if (resid <= tol || it >= MAX_ITER || (it > 1 && resid >= last)) break;                      \
        last = resid;                                                                                \
        double tn = dense_step(kind, t, S, Sp);                                                      \
        if (!(tn > t)) {                                                                             \
            if (!(it == 0 && S < 1.0)) break; /* at the root to rounding */                          \
            tn = fmax(tn, t_lo);                                                                     \
            if (!(tn < t)) break;                                                                    \
        }                                                                                            \
        dt = tn - t;                                                                                 \
        if (kind == KIND_JEFF) jmode = jeffrey_mode(fmin(t, tn), dt, jmode);                         \
        t = tn;                                                                                      \
        it++;                                                                                        \
    }                                                                                                \
    *ssum = (T)Sp;                                                                                   \
    *iters = it;                                                                                     \
    return t;                                                                                        \
}                                                                                                    \
                                                                                                     \
/* The conjugate Omega*(z) = tau + sum_j [f*(z_j - tau) + f(0)] of a row solved at t = tau - m (JS and  \
   Hellinger, whose terms are positive: no cancellation), in double; at the root it equals            \
   <z, p> - sum_j [f(p_j) - f(0)], and it is stationary in tau (its derivative is 1 - S), so the       \
   solver's residual enters at second order.  JS: f*(v) + f(0) = -log(1 - e^v / 2) = -log1p(-y_j / c)  \
   with y = e (exp(z - m), from the first pass) and c = 2 e^t, as log(u) less the rounding of          \
   u = 1 - x divided by u (the vector log; an accurate log1p); Hellinger: f*(v) + f(0) = 1/(1 - v)    \
   = 1/(1 + t + m - z_j) (0 where masked). */                                                         \
static double dense_conjugate_##SUFFIX(const T *z, double m, const double *e, long k, int kind,      \
                                       double t) {                                                   \
    double A = 0;                                                                                    \
    if (kind == KIND_JS) {                                                                           \
        const double ic = 0.5 * exp(-t);                                                             \
        _Pragma("omp simd reduction(+ : A)")                                                         \
        for (long j = 0; j < k; j++) {                                                               \
            const double x = e[j] * ic, u = 1.0 - x;                                                 \
            A += ((u - 1.0) + x) / u - log(u);                                                       \
        }                                                                                            \
    } else {                                                                                         \
        const double t1 = t + 1.0;                                                                   \
        _Pragma("omp simd reduction(+ : A)")                                                         \
        for (long j = 0; j < k; j++) A += 1.0 / (t1 + (m - (double)z[j]));                           \
    }                                                                                                \
    return (t + m) + A;                                                                              \
}                                                                                                    \
                                                                                                     \
/* conj (JS and Hellinger, or NULL): dense_conjugate of the row (NaN in rows with NaN or +inf, 0 in   \
   rows with every entry -inf, where p = 0) */                                                       \
static int row_dense_##SUFFIX(const T *z, long k, int kind, T *p, T *s, T *tau, T *ssum,             \
                            double *ebuf, double *w, int *iters, double *conj) {                     \
    int bad;                                                                                         \
    double sz, zmin;                                                                                 \
    const double m = row_stats_##SUFFIX(z, k, &bad, &sz, &zmin);                                     \
    *iters = 0;                                                                                      \
    if (bad || m == -INFINITY) {                                                                     \
        const T fill = bad ? (T)NAN : (T)0;                                                          \
        for (long j = 0; j < k; j++) { p[j] = fill; s[j] = 0; }                                      \
        if (conj) *conj = bad ? NAN : 0.0;                                                           \
        *tau = bad ? (T)NAN : (T)0; *ssum = 0; return bad ? 2 : 1;                                   \
    }                                                                                                \
    /* the row sums of the start (dense_start): JS's from its pass of exp, the others' from the stats \
       (every entry finite: the sum is), else from a pass over the finite entries */                 \
    double a1 = (double)k * m - sz, a2 = (double)k;                                                  \
    const double *e = NULL;                                                                          \
    if (kind == KIND_JS) {                                                                           \
        a1 = 0;                                                                                      \
        a2 = 0;                                                                                      \
        _Pragma("omp simd reduction(+ : a1, a2)")                                                    \
        for (long j = 0; j < k; j++) {                                                               \
            const double y = exp((double)z[j] - m);                                                  \
            ebuf[j] = y; a1 += y; a2 += y * y;                                                       \
        }                                                                                            \
        e = ebuf;                                                                                    \
    } else if (!(sz > -INFINITY && sz < INFINITY)) {                                                 \
        dense_sums_##SUFFIX(z, k, m, &a1, &a2);                                                      \
    }                                                                                                \
    const double tol = fmax(4 * EPS, 8 * DBL_EPSILON * log2((double)k + 1));                         \
    const double t_lo = dense_t_lo(kind);                                                            \
    const double emax = m - zmin; /* +inf: some entry is masked */                                   \
    const double t = iterate_dense_##SUFFIX(z, m, e, ebuf, w, k, kind, tol, fmax(t_lo, dense_start(kind, a1, a2)), \
                                          t_lo, emax, p, s, ssum, iters);                            \
    if (conj) *conj = dense_conjugate_##SUFFIX(z, m, e, k, kind, t);                                 \
    *tau = (T)(t + m);                                                                               \
    return 0;                                                                                        \
}

#define DEFINE_ROWS(T, SUFFIX, EPS, TINY)                                                        \
/* max_j z[j] over the block [j0, j1) (-inf for a masked block; NaN-free rows: row_max checked them) */ \
static inline T block_max_##SUFFIX(const T *z, long j0, long j1) {                             \
    T bm = -INFINITY;                                                                            \
    _Pragma("omp simd reduction(max : bm)")                                                      \
    for (long j = j0; j < j1; j++) bm = z[j] > bm ? z[j] : bm;                                   \
    return bm;                                                                                   \
}                                                                                                \
                                                                                                 \
/* the row maximum; *bad set if the row has NaN or +inf */                                       \
static T row_max_##SUFFIX(const T *z, long k, int *bad) {                                        \
    T m = -INFINITY;                                                                             \
    int b = 0;                                                                                   \
    _Pragma("omp simd reduction(max : m) reduction(| : b)")                                      \
    for (long j = 0; j < k; j++) {                                                               \
        b |= (z[j] != z[j]) | (z[j] == (T)INFINITY);                                             \
        m = z[j] > m ? z[j] : m;                                                                 \
    }                                                                                            \
    *bad = b;                                                                                    \
    return m;                                                                                    \
}                                                                                                \
                                                                                                 \
/* The start of a row weighted by q (a lower bound of its root, in the variable y = a (z - m)): a      \
   single entry j has q_j (y_j - t)^{1/a} >= 1 for t <= y_j - q_j^{-a}, so the largest such bound is   \
   below the root.  It is within a factor k^a of the root's distance to the entries (the root has   \
   some q_j (y_j - t)^{1/a} >= 1/k), so that the first Newton step does not round away the base of   \
   a row whose maximum has a tiny weight (from t = -q_max^{-a} = -40 to a root at -0.016, the step   \
   left Sum p - 1 = 6e-13).  Short rows (bmax NULL): that bound over every entry.  Longer rows: over \
   the block maxima, then the root on the block maxima above it (a subset's root is below the       \
   row's), less a rounding margin.  Writes the block maxima into bmax (as the unweighted start);    \
   qpow: q_j^{-a} (one q for all rows) or NULL; d, w, c, idx: scratch. */                        \
static double weighted_start_##SUFFIX(const T *z, const T *q, const double *qpow, long k, double a, \
                                      double m, double tol, double *bmax, double *d, double *w,   \
                                      double *c, int32_t *idx) {                                  \
    /* q_j^{-a}: precomputed (qpow, one q for all rows) or computed for the entries that can raise \
       the bound (those above it: the row maximum's first, so that most fall below) */           \
    if (!bmax) {                                                                                 \
        long jm = 0;                                                                             \
        while (jm < k - 1 && (double)z[jm] != m) jm++;                                           \
        double lo = -(qpow ? qpow[jm] : weight_power((double)q[jm], a));                         \
        for (long j = 0; j < k; j++) {                                                           \
            const double v = a * ((double)z[j] - m);                                             \
            if (v > lo) {                                                                        \
                const double bound = v - (qpow ? qpow[j] : weight_power((double)q[j], a));       \
                lo = bound > lo ? bound : lo;                                                    \
            }                                                                                    \
        }                                                                                        \
        return lo;                                                                               \
    }                                                                                            \
    const long nblocks = (k + BLOCK - 1) / BLOCK;                                                \
    long top = 0;                                                                                \
    for (long j0 = 0, b = 0; j0 < k; j0 += BLOCK, b++) {                                         \
        const long j1 = j0 + BLOCK < k ? j0 + BLOCK : k;                                         \
        const T bm = block_max_##SUFFIX(z, j0, j1);                                          \
        long jb = j1 - 1; /* the maximum's first entry (its weight): a vectorized min reduction */ \
        _Pragma("omp simd reduction(min : jb)")                                                  \
        for (long j = j0; j < j1; j++) jb = z[j] == bm && j < jb ? j : jb;                       \
        const double v = a * ((double)bm - m);                                                   \
        bmax[b] = v;                                                                             \
        d[b] = v; c[b] = (double)q[jb]; idx[b] = (int32_t)jb;                                    \
        top = v > d[top] ? b : top;                                                              \
    }                                                                                            \
    double lo = d[top] - (qpow ? qpow[idx[top]] : weight_power(c[top], a));                     \
    for (long b = 0; b < nblocks; b++) {                                                         \
        if (d[b] > lo) {                                                                         \
            const double bound = d[b] - (qpow ? qpow[idx[b]] : weight_power(c[b], a));          \
            lo = bound > lo ? bound : lo;                                                        \
        }                                                                                        \
    }                                                                                            \
    long nb = 0;                                                                                 \
    for (long b = 0; b < nblocks; b++) { /* the block maxima above the bound */                  \
        d[nb] = d[b]; c[nb] = c[b]; idx[nb] = 0; nb += d[b] > lo;                                \
    }                                                                                            \
    if (nb == 0) return lo;                                                                      \
    int it0 = 0;                                                                                 \
    const double t0 = iterate_power_weighted(d, w, c, idx, &nb, a, tol, &it0, lo);               \
    const double t1 = t0 - 64 * DBL_EPSILON * (fabs(t0) > 1.0 ? fabs(t0) : 1.0);                 \
    return t1 > lo ? t1 : lo;                                                                    \
}                                                                                                \
                                                                                                 \
static int row_power_##SUFFIX(const T *z, const T *q, const double *qpow, long k, double a, T *p, T *s, T *tau, \
                              T *ssum, double *d, double *w, double *c, int32_t *idx, int *iters, \
                              double *sums, double oc, double osc) {                             \
    int bad;                                                                                     \
    const double m = (double)row_max_##SUFFIX(z, k, &bad);                                       \
    memset(p, 0, (size_t)k * sizeof(T));                                                         \
    memset(s, 0, (size_t)k * sizeof(T));                                                         \
    *iters = 0;                                                                                  \
    if (bad) {                                                                                   \
        for (long j = 0; j < k; j++) p[j] = (T)NAN;                                              \
        if (sums) { sums[0] = NAN; sums[1] = NAN; }                                              \
        *tau = (T)NAN; *ssum = 0; return 2;                                                      \
    }                                                                                            \
    if (sums) { sums[0] = 0; sums[1] = 0; }                                                      \
    if (m == -INFINITY) { *tau = (T)(-1.0); *ssum = 0; return 1; }                               \
    const double tol = fmax(4 * EPS, 8 * DBL_EPSILON * log2((double)k + 1));                     \
    /* the start: the root on the block maxima alone (a subset's root is below the row's: S is a  \
       sum of non-negative terms), less a rounding margin, when the row has enough blocks; only  \
       entries above it are candidates (flat rows: a tenth of the row instead of most of it) */  \
    double t0 = -1.0;                                                                            \
    const long nblocks = (k + BLOCK - 1) / BLOCK;                                                \
    /* the block maxima a (max - m), kept for the candidate pass in w[nblocks + PAD, 2 nblocks +  \
       PAD): w has k + PAD >= 2 nblocks + PAD entries and the start's iterations use w[0, nblocks  \
       + PAD) only (the padding included) */                                                     \
    double *const bmax = nblocks >= 8 ? w + nblocks + PAD : NULL;                                \
    if (q) { /* weighted: the start below */                                                     \
        t0 = weighted_start_##SUFFIX(z, q, qpow, k, a, m, tol, bmax, d, w, c, idx);              \
    } else if (bmax) {                                                                           \
        long nb = 0;                                                                             \
        for (long j0 = 0, b = 0; j0 < k; j0 += BLOCK, b++) {                                     \
            const long j1 = j0 + BLOCK < k ? j0 + BLOCK : k;                                     \
            const T bm = block_max_##SUFFIX(z, j0, j1);                                      \
            const double v = a * ((double)bm - m);                                               \
            bmax[b] = v;                                                                         \
            d[nb] = v; idx[nb] = 0; nb += v > -1.0;                                              \
        }                                                                                        \
        int it0 = 0;                                                                             \
        if (nb > 1) {                                                                            \
            t0 = iterate_power(d, w, idx, &nb, a, tol, &it0, -1.0);                              \
            t0 = fmax(-1.0, t0 - 64 * DBL_EPSILON);                                              \
        }                                                                                        \
    }                                                                                            \
    /* candidates d_j = a (z_j - m) > t0, found block by block (a block whose maximum fails      \
       the test is skipped: the map is monotone) */                                              \
    long n = 0;                                                                                  \
    for (long j0 = 0, b = 0; j0 < k; j0 += BLOCK, b++) {                                         \
        const long j1 = j0 + BLOCK < k ? j0 + BLOCK : k;                                         \
        double v0;                                                                               \
        if (bmax) {                                                                              \
            v0 = bmax[b];                                                                        \
        } else {                                                                                 \
            const T bm = block_max_##SUFFIX(z, j0, j1);                                      \
            v0 = a * ((double)bm - m);                                                           \
        }                                                                                        \
        if (!(v0 > t0)) continue;                                                                \
        if (q) {                                                                                 \
            for (long j = j0; j < j1; j++) {                                                     \
                const double v = a * ((double)z[j] - m);                                         \
                d[n] = v; c[n] = (double)q[j]; idx[n] = (int32_t)j; n += v > t0;                 \
            }                                                                                    \
        } else {                                                                                 \
            for (long j = j0; j < j1; j++) { /* branch-free: n <= j, so d[n] is in the buffer */ \
                const double v = a * ((double)z[j] - m);                                         \
                d[n] = v; idx[n] = (int32_t)j; n += v > t0;                                      \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
    const double t = q ? iterate_power_weighted(d, w, c, idx, &n, a, tol, iters, t0)             \
                       : iterate_power(d, w, idx, &n, a, tol, iters, t0);                        \
    double sum_s = 0;                                                                            \
    for (long i = 0; i < n; i++) { /* p_j = c_j g, s_j = c_j g' (c = q_j, or 1) */               \
        const double b = d[i] - t, gp = a == 1.0 ? 1.0 : a == 0.5 ? b : w[i];                    \
        const double cg = q ? c[i] * gp : gp;                                                    \
        p[idx[i]] = (T)(cg * b); s[idx[i]] = (T)cg; sum_s += cg;                                 \
    }                                                                                            \
    if (sums) { /* <z, p> and osc * sum_j p_j (p_j^a - oc) over the support (p^a = d - t), from p as written */ \
        double zp = 0, om = 0;                                                                   \
        for (long i = 0; i < n; i++) {                                                           \
            const double pi = (double)p[idx[i]];                                                 \
            zp += (double)z[idx[i]] * pi;                                                        \
            om += pi * (d[i] - t - oc);                                                          \
        }                                                                                        \
        sums[0] = zp; sums[1] = osc * om;                                                        \
    }                                                                                            \
    *tau = (T)(t + a * m);                                                                       \
    *ssum = (T)sum_s;                                                                            \
    return 0;                                                                                    \
}                                                                                                \
                                                                                                 \
DEFINE_DENSE(T, SUFFIX, EPS)                                                                     \
                                                                                                 \
/* Solve rows [r0, r1) with the thread's buffers: buf (2 (k + PAD) doubles, 3 (k + PAD) with q), idx \
   (k + PAD), and srow (k entries, for s when s is NULL).  Returns the most Newton steps of those    \
   rows; *bad |= 1 if one of them has status 2. */                                               \
static int solve_range_##SUFFIX(const T *z, long r0, long r1, long k, int kind, const double *a, \
                                long a_stride, const T *q, long q_stride, const double *qpow,   \
                                T *p, T *s, T *tau,                                              \
                                T *ssum, int8_t *status,                                         \
                                int convert, double offset, double *sums, double oc, double osc, \
                                double *buf, int32_t *idx, T *srow, int *bad) {                   \
    int most = 0, any_bad = 0;                                                                   \
    for (long r = r0; r < r1; r++) {                                                             \
        int it = 0;                                                                              \
        T tau_r, ssum_r;                                                                         \
        double row_sums[2];                                                                      \
        const T *zr = z + r * k;                                                                 \
        T *pr = p + r * k, *sr = s ? s + r * k : srow;                                           \
        const double ar = a[r * a_stride];                                                       \
        const int st = kind == KIND_POWER                                                        \
            ? row_power_##SUFFIX(zr, q ? q + r * q_stride : NULL, qpow, k, ar, pr, sr, &tau_r, &ssum_r, \
                                 buf, buf + k + PAD, buf + 2 * (k + PAD), idx, &it,             \
                                 sums ? row_sums : NULL, oc, osc)                                \
            : row_dense_##SUFFIX(zr, k, kind, pr, sr, &tau_r, &ssum_r, buf, buf + k + PAD, &it,    \
                                 sums && (kind == KIND_JS || kind == KIND_HELL) ? row_sums : NULL);      \
        /* tau_f = (tau + c) / a computed in T, as PyTorch computes it on a T tensor */           \
        if (convert && kind == KIND_POWER) tau_r = (T)(tau_r + (T)offset) / (T)ar;                \
        if (tau) tau[r] = tau_r;                                                                 \
        if (ssum) ssum[r] = ssum_r;                                                              \
        if (status) status[r] = (int8_t)st;                                                      \
        if (sums && kind == KIND_POWER) { sums[2 * r] = row_sums[0]; sums[2 * r + 1] = row_sums[1]; } \
        if (sums && (kind == KIND_JS || kind == KIND_HELL)) { sums[2 * r] = row_sums[0]; sums[2 * r + 1] = 0; } \
        any_bad |= st == 2;                                                                      \
        most = it > most ? it : most;                                                            \
    }                                                                                            \
    *bad |= any_bad;                                                                             \
    return most;                                                                                 \
}                                                                                                \
                                                                                                 \
/* Solve rows [0, R) of z.  a: per-row exponents (a_stride 0: one for all rows).  q (or NULL):    \
   KIND_POWER's reference measure, positive and finite, row r at q + r * q_stride (q_stride 0: one  \
   for all rows): p_j = q_j [y_j - t]_+^{1/a} and s_j = q_j g' (the other kinds take NULL).  convert: for \
   KIND_POWER, write tau_f = (t + offset)/a (in T) instead of t.  s, tau, ssum and status may  \
   be NULL (not written: a caller that needs p alone).  Returns 2 * (the most Newton steps    \
   any row took) + (1 if some row has status 2), or -1 (no memory); status[r] as described at \
   the top.  sums (or NULL): [R, 2], in double, the Fenchel-Young loss values' row sums: for     \
   KIND_POWER per row <z, p> and osc * sum_j p_j (p_j^a - oc) over the support; for KIND_JS and  \
   KIND_HELL the conjugate Omega*(z) (dense_conjugate) and 0; the other kinds leave it unwritten.  One thread solves without entering an OpenMP parallel region. */           \
int sa_solve_##SUFFIX(const T *z, long R, long k, int kind, const double *a, long a_stride,    \
                      const T *q, long q_stride, T *p, T *s, T *tau, T *ssum, int8_t *status,  \
                      int nthreads, int convert, double offset, double *sums, double oc,         \
                      double osc) {                                                              \
    int most = 0, failed = 0, bad = 0;                                                           \
    const size_t srow_size = s ? 0 : (size_t)k * sizeof(T);                                      \
    const long nbuf = (q ? 3 : 2) * (k + PAD);                                                   \
    /* one q and one a for all rows: the starts' q_j^{-a} computed once (R k of them otherwise) */   \
    double *qpow = NULL;                                                                         \
    if (q && q_stride == 0 && a_stride == 0 && kind == KIND_POWER && R > 1) {                    \
        qpow = (double *)malloc((size_t)k * sizeof(double));                                     \
        if (!qpow) return -1;                                                                    \
        for (long j = 0; j < k; j++) qpow[j] = weight_power((double)q[j], a[0]);                 \
    }                                                                                            \
    if (nthreads <= 1) {                                                                         \
        double *buf = (double *)malloc((size_t)nbuf * sizeof(double) + srow_size);               \
        int32_t *idx = (int32_t *)malloc((size_t)(k + PAD) * sizeof(int32_t));                   \
        if (!buf || !idx) failed = 1;                                                            \
        else most = solve_range_##SUFFIX(z, 0, R, k, kind, a, a_stride, q, q_stride, qpow, p, s, tau, \
                                         ssum, status, convert, offset, sums, oc, osc, buf, idx, \
                                         (T *)(buf + nbuf), &bad);                               \
        free(buf);                                                                               \
        free(idx);                                                                               \
        free(qpow);                                                                              \
        return failed ? -1 : 2 * most + bad;                                                     \
    }                                                                                            \
    _Pragma("omp parallel num_threads(nthreads) reduction(max : most) reduction(| : failed, bad)") \
    {                                                                                            \
        double *buf = (double *)malloc((size_t)nbuf * sizeof(double) + srow_size);               \
        int32_t *idx = (int32_t *)malloc((size_t)(k + PAD) * sizeof(int32_t));                   \
        const int ok = buf && idx;                                                               \
        if (!ok) failed = 1;                                                                     \
        /* every thread meets the worksharing loop, also one whose buffers failed */             \
        _Pragma("omp for schedule(static)")                                                      \
        for (long r = 0; r < R; r++) {                                                           \
            if (!ok) continue;                                                                   \
            const int it = solve_range_##SUFFIX(z, r, r + 1, k, kind, a, a_stride, q, q_stride, qpow, p, \
                                                s, tau, ssum, status, convert, offset, sums, oc, \
                                                osc, buf, idx, (T *)(buf + nbuf), &bad);         \
            most = it > most ? it : most;                                                        \
        }                                                                                        \
        free(buf);                                                                               \
        free(idx);                                                                               \
    }                                                                                            \
    free(qpow);                                                                                  \
    return failed ? -1 : 2 * most + bad;                                                         \
}                                                                                                \
                                                                                                 \
/* The small calls' entry (an operator's forward, with or without its gradient): sa_solve with   \
   one exponent a for all rows and no tau, statuses or row sums, in fewer arguments (each costs  \
   the caller's ctypes a conversion).  p is written as sa_solve writes it; s and sc may be NULL; \
   sc[r] is the divisor of the backward's <s, v> / sum s (sa_jvp): sum_j s_rj clamped below at   \
   the type's smallest normal number (as PyTorch's clamp_min(tiny) of sa_solve's ssum), NaN in   \
   a row with NaN or +inf (status 2, whose p is NaN), so that its gradient is NaN.               \
   Returns as sa_solve. */                                                                        \
int sa_map_##SUFFIX(const T *z, long R, long k, int kind, double a, T *p, T *s, T *sc,          \
                    int nthreads) {                                                              \
    const int ret = sa_solve_##SUFFIX(z, R, k, kind, &a, 0, NULL, 0, p, s, NULL, sc, NULL, nthreads, 0, \
                                      0.0, NULL, 0.0, 1.0);                                      \
    if (sc && ret >= 0)                                                                          \
        for (long r = 0; r < R; r++)                                                             \
            sc[r] = p[r * k] != p[r * k] ? (T)NAN : sc[r] < TINY ? TINY : sc[r];                 \
    return ret;                                                                                  \
}                                                                                                \
                                                                                                 \
/* The backward of the normalized mappings (Solution.jvp): per row g = scale s (v - c),          \
   c = <s, v> / sc, with the sums and products in double (sc as sa_map writes it: a NaN sc makes \
   the row NaN).  s, v, g: contiguous [R, k]; sc: [R]. */                                         \
void sa_jvp_##SUFFIX(const T *s, const T *v, const T *sc, T *g, long R, long k, double scale,   \
                     int nthreads) {                                                             \
    _Pragma("omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1)")        \
    for (long r = 0; r < R; r++) {                                                               \
        const T *sr = s + r * k, *vr = v + r * k;                                                \
        T *gr = g + r * k;                                                                       \
        double sv = 0;                                                                           \
        _Pragma("omp simd reduction(+ : sv)")                                                    \
        for (long j = 0; j < k; j++) sv += (double)sr[j] * (double)vr[j];                        \
        const double c = sv / (double)sc[r];                                                     \
        _Pragma("omp simd")                                                                      \
        for (long j = 0; j < k; j++) gr[j] = (T)(scale * ((double)sr[j] * ((double)vr[j] - c))); \
    }                                                                                            \
}

DEFINE_ROWS(float, f32, (double)FLT_EPSILON, FLT_MIN)
DEFINE_ROWS(double, f64, DBL_EPSILON, DBL_MIN)

/* -- alpha-ReLU (softargmax.operators.alpha_relu), elementwise ------------------------------------
 * p = [a x - tau]_+^{1/a} with a = alpha - 1 > 0, and the backward dx = g [a x - tau]_+^{1/a - 1}
 * (= g p^{2 - alpha}), with one tau for the whole tensor or one per row of k entries (taus).  The
 * base t = [x a - tau]_+ is formed in T with the PyTorch path's roundings (x a, then minus tau, each
 * rounded to T; a = 1: no product; NaN stays NaN, -inf gives 0), so that the exact forms are bit for
 * bit that path's: a = 1 (alpha = 2) p = t, d = 1[t > 0] (NaN at NaN); a = 1/2 (alpha = 1.5) p = t^2,
 * d = t; a = 2 (alpha = 3) p = sqrt(t), d = 1/sqrt(t) (0 at t = 0 and NaN).  Other a: the powers are
 * POW(t, e) in double rounded to T: for float and bfloat16 exp(e log t) (pow_pos; its error, ~|e ln t|
 * double ulps, is far below a float's rounding), for double pow (within an ulp, as PyTorch's;
 * exp(e log t) was hundreds of ulps off at alpha = 1.01), d is 0 at t = 0 and, where 1/a - 1 < 0, at NaN (the
 * PyTorch path's where(t > 0, ...)).  dx = g d in T.  bfloat16 entries are computed in float (T) and
 * rounded once when stored, as the PyTorch path computes them in float32 and converts.  The forward reads x and writes p; the backward
 * reads x and g and writes dx (and the sums of dx for tau's gradient): one pass each, no temporary.
 * Entries are split over OpenMP threads in blocks of RELU_BLOCK (one tau) or by rows (one tau per row).
 * tau's gradient with one tau: each block's sum goes to its own slot and the slots are added in block
 * order after the parallel loop, so the result is the same for every thread count and run (an OpenMP
 * reduction's order depends on the threads). */
#define RELU_BLOCK 4096 /* softargmax.backends.cpu.rows.RELU_BLOCK: at most one thread per block */
#define RELU_CHUNK 256
#define RELU_SLOTS 64 /* tau's partial sums kept on the stack up to this many blocks */

/* bfloat16 storage: its bits are the top half of a float's; to bfloat16 rounds to nearest even, a NaN to
   the quiet NaN 0x7FC0 (PyTorch's conversion) */
static inline float bf16_load(uint16_t v) {
    union { uint32_t u; float f; } c;
    c.u = (uint32_t)v << 16;
    return c.f;
}
static inline uint16_t bf16_store(float f) {
    union { uint32_t u; float f; } c;
    c.f = f;
    const uint16_t r = (uint16_t)((c.u + 0x7FFFu + ((c.u >> 16) & 1u)) >> 16);
    return f != f ? (uint16_t)0x7FC0 : r;
}
#define SA_SAME(v) (v)

/* S: the stored type, T: the compute type (float for bfloat16), LD/ST: the conversions between them */
#define DEFINE_ALPHA_RELU(S, T, SUFFIX, LD, ST, POW)                                                     \
static inline T relu_base_##SUFFIX(T x, T aT, int unit, T tau) {                                      \
    const T t = (unit ? x : x * aT) - tau;                                                            \
    return t < 0 ? (T)0 : t; /* NaN stays NaN */                                                      \
}                                                                                                     \
                                                                                                      \
/* the bases t = relu_base(x) of a chunk of m <= RELU_CHUNK entries into tb, and buf = t^e in double where t > 0 (1 \
   elsewhere: the caller keeps t there) */                                                           \
static inline void relu_chunk_powers_##SUFFIX(const S *xc, long m, T aT, T tau, double e, T *tb, double *buf) { \
    _Pragma("omp simd")                                                                              \
    for (long j = 0; j < m; j++) {                                                                   \
        const T t = relu_base_##SUFFIX(LD(xc[j]), aT, 0, tau);                                       \
        tb[j] = t;                                                                                   \
        buf[j] = t > 0 ? (double)t : 1.0;                                                            \
    }                                                                                                \
    _Pragma("omp simd")                                                                              \
    for (long j = 0; j < m; j++) buf[j] = POW(buf[j], e);                                            \
}                                                                                                    \
                                                                                                     \
static void relu_fwd_span_##SUFFIX(const S *x, S *p, long n, double a, T tau) {                      \
    const T aT = (T)a;                                                                                \
    if (a == 1.0) {                                                                                   \
        _Pragma("omp simd")                                                                           \
        for (long j = 0; j < n; j++) p[j] = ST(relu_base_##SUFFIX(LD(x[j]), aT, 1, tau));             \
    } else if (a == 0.5) {                                                                            \
        _Pragma("omp simd")                                                                           \
        for (long j = 0; j < n; j++) { const T t = relu_base_##SUFFIX(LD(x[j]), aT, 0, tau); p[j] = ST(t * t); } \
    } else if (a == 2.0) {                                                                            \
        _Pragma("omp simd")                                                                           \
        for (long j = 0; j < n; j++) p[j] = ST((T)sqrt(relu_base_##SUFFIX(LD(x[j]), aT, 0, tau)));    \
    } else { /* in chunks: the bases, their powers (vectorized), the results */                      \
        const double e = 1.0 / a;                                                                     \
        double buf[RELU_CHUNK];                                                                       \
        T tb[RELU_CHUNK];                                                                             \
        for (long i0 = 0; i0 < n; i0 += RELU_CHUNK) {                                                 \
            const long m = n - i0 < RELU_CHUNK ? n - i0 : RELU_CHUNK;                                 \
            const S *xc = x + i0;                                                                     \
            S *pc = p + i0;                                                                           \
            relu_chunk_powers_##SUFFIX(xc, m, aT, tau, e, tb, buf);                                   \
            _Pragma("omp simd")                                                                       \
            for (long j = 0; j < m; j++) pc[j] = ST(tb[j] > 0 ? (T)buf[j] : tb[j]);                   \
        }                                                                                             \
    }                                                                                                 \
}                                                                                                     \
                                                                                                      \
/* dx = g d over n entries, in T and then stored; returns the sum of the products g d (before they are \
   stored) in double when want_sum (else 0) */                                                        \
static double relu_bwd_span_##SUFFIX(const S *x, const S *g, S *gx, long n, double a, T tau,          \
                                      int want_sum) {                                                 \
    const T aT = (T)a;                                                                                \
    double s = 0;                                                                                     \
    if (a == 0.5) {                                                                                   \
        if (want_sum) {                                                                               \
            _Pragma("omp simd reduction(+ : s)")                                                      \
            for (long j = 0; j < n; j++) {                                                            \
                const T v = LD(g[j]) * relu_base_##SUFFIX(LD(x[j]), aT, 0, tau);                      \
                gx[j] = ST(v);                                                                        \
                s += (double)v;                                                                       \
            }                                                                                         \
        } else {                                                                                      \
            _Pragma("omp simd")                                                                       \
            for (long j = 0; j < n; j++) gx[j] = ST(LD(g[j]) * relu_base_##SUFFIX(LD(x[j]), aT, 0, tau)); \
        }                                                                                             \
    } else if (a == 1.0 || a == 2.0) {                                                                \
        const int unit = a == 1.0;                                                                    \
        _Pragma("omp simd reduction(+ : s)")                                                          \
        for (long j = 0; j < n; j++) {                                                                \
            const T t = relu_base_##SUFFIX(LD(x[j]), aT, unit, tau);                                  \
            const T d = unit ? (t > 0 ? (T)1 : t * (T)0) : (t > 0 ? (T)1 / (T)sqrt(t) : (T)0);       \
            const T v = LD(g[j]) * d;                                                                 \
            gx[j] = ST(v);                                                                            \
            s += want_sum ? (double)v : 0.0;                                                          \
        }                                                                                             \
    } else {                                                                                          \
        const double e = (1.0 - a) / a;                                                               \
        const T at_zero_nan = e < 0 ? (T)0 : (T)NAN; /* d at NaN: where(t > 0, t^e, 0) if e < 0 */    \
        double buf[RELU_CHUNK];                                                                       \
        T tb[RELU_CHUNK];                                                                             \
        for (long i0 = 0; i0 < n; i0 += RELU_CHUNK) {                                                 \
            const long m = n - i0 < RELU_CHUNK ? n - i0 : RELU_CHUNK;                                 \
            const S *xc = x + i0, *gc = g + i0;                                                       \
            S *oc = gx + i0;                                                                          \
            relu_chunk_powers_##SUFFIX(xc, m, aT, tau, e, tb, buf);                                   \
            _Pragma("omp simd reduction(+ : s)")                                                      \
            for (long j = 0; j < m; j++) {                                                            \
                const T t = tb[j];                                                                    \
                const T d = t > 0 ? (T)buf[j] : t == 0 ? (T)0 : at_zero_nan;                          \
                const T v = LD(gc[j]) * d;                                                            \
                oc[j] = ST(v);                                                                        \
                s += want_sum ? (double)v : 0.0;                                                      \
            }                                                                                         \
        }                                                                                             \
    }                                                                                                 \
    return s;                                                                                         \
}                                                                                                     \
                                                                                                      \
/* relu_bwd_span with g contiguous (gs = 1) or one value for every entry (gs = 0: an expanded gradient,  \
   read from a chunk filled with it) */                                                               \
static double relu_bwd_range_##SUFFIX(const S *x, const S *g, long gs, S *gx, long n, double a, T tau,  \
                                      int want_sum) {                                                 \
    if (gs) return relu_bwd_span_##SUFFIX(x, g, gx, n, a, tau, want_sum);                             \
    S gbuf[RELU_CHUNK];                                                                               \
    for (long j = 0; j < RELU_CHUNK; j++) gbuf[j] = g[0];                                             \
    double s = 0;                                                                                     \
    for (long i0 = 0; i0 < n; i0 += RELU_CHUNK)                                                       \
        s += relu_bwd_span_##SUFFIX(x + i0, gbuf, gx + i0, n - i0 < RELU_CHUNK ? n - i0 : RELU_CHUNK, a, tau, \
                                    want_sum);                                                        \
    return s;                                                                                         \
}                                                                                                     \
                                                                                                      \
/* p of the contiguous [R, k] entries x: tau (rounded to T) for all, or taus[r] (T) for row r */      \
void sa_relu_fwd_##SUFFIX(const S *x, long R, long k, double a, double tau, const T *taus, S *p,      \
                          int nthreads) {                                                             \
    if (taus) {                                                                                       \
        _Pragma("omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1)")         \
        for (long r = 0; r < R; r++) relu_fwd_span_##SUFFIX(x + r * k, p + r * k, k, a, taus[r]);    \
        return;                                                                                       \
    }                                                                                                 \
    const long n = R * k, blocks = (n + RELU_BLOCK - 1) / RELU_BLOCK;                                 \
    _Pragma("omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1)")             \
    for (long b = 0; b < blocks; b++) {                                                               \
        const long i0 = b * RELU_BLOCK;                                                               \
        relu_fwd_span_##SUFFIX(x + i0, p + i0, n - i0 < RELU_BLOCK ? n - i0 : RELU_BLOCK, a, (T)tau); \
    }                                                                                                 \
}                                                                                                     \
                                                                                                      \
/* dx of the contiguous [R, k] entries x with incoming gradient g (S; contiguous, gs = 1, or one value \
   for all, gs = 0), tau or taus as sa_relu_fwd; unless gtau is NULL the sums of g d in double: gtau[0] \
   over all entries (one tau) or gtau[r] over row r (taus) */                                         \
void sa_relu_bwd_##SUFFIX(const S *x, const S *g, long gs, long R, long k, double a, double tau,       \
                          const T *taus, S *gx, double *gtau, int nthreads) {                         \
    const int want = gtau != NULL;                                                                    \
    if (taus) {                                                                                       \
        _Pragma("omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1)")         \
        for (long r = 0; r < R; r++) {                                                                \
            const double s = relu_bwd_range_##SUFFIX(x + r * k, g + gs * r * k, gs, gx + r * k, k, a, taus[r], \
                                                     want);                                           \
            if (want) gtau[r] = s;                                                                    \
        }                                                                                             \
        return;                                                                                       \
    }                                                                                                 \
    const long n = R * k, blocks = (n + RELU_BLOCK - 1) / RELU_BLOCK;                                 \
    /* each block's sum in its slot (on the stack for a few blocks), added in block order below: the same \
       sum for any thread count; no memory for the slots: one thread adds them in that order */       \
    double slots[RELU_SLOTS];                                                                         \
    double *part = !want ? NULL : blocks <= RELU_SLOTS ? slots : (double *)malloc((size_t)blocks * sizeof(double)); \
    const int nt = want && !part ? 1 : nthreads;                                                      \
    double total = 0;                                                                                 \
    _Pragma("omp parallel for schedule(static) num_threads(nt) if (nt > 1)")                         \
    for (long b = 0; b < blocks; b++) {                                                               \
        const long i0 = b * RELU_BLOCK;                                                               \
        const double s = relu_bwd_range_##SUFFIX(x + i0, g + gs * i0, gs, gx + i0,                   \
                                                  n - i0 < RELU_BLOCK ? n - i0 : RELU_BLOCK, a, (T)tau, want); \
        if (part) part[b] = s;                                                                        \
        else if (want) total += s; /* (one thread) */                                                 \
    }                                                                                                 \
    if (!want) return;                                                                                \
    if (part) {                                                                                       \
        for (long b = 0; b < blocks; b++) total += part[b];                                           \
        if (part != slots) free(part);                                                                \
    }                                                                                                 \
    gtau[0] = total;                                                                                  \
}

DEFINE_ALPHA_RELU(float, float, f32, SA_SAME, SA_SAME, pow_pos)
DEFINE_ALPHA_RELU(double, double, f64, SA_SAME, SA_SAME, pow)
DEFINE_ALPHA_RELU(uint16_t, float, bf16, bf16_load, bf16_store, pow_pos)

/* -- the class-index loss's class weights and backward (softargmax.losses._index_loss) ------------
 * sa_weights_ok: whether the k class weights are all finite and >= 0 (NaN is not), one pass.
 * sa_scale_rows: the backward's out[r, :] = G[r, :] * s_r in T, with s_r = (T)((T)f * wrow[r]) (the general
 * path's MulBackward of the rows' weights after its DivBackward) or s_r = (T)f where wrow is NULL; out may
 * be G (in place); rows split over nthreads. */
#define DEFINE_INDEX_SCALE(T, SUFFIX)                                                                 \
int sa_weights_ok_##SUFFIX(const T *w, long k) {                                                      \
    int ok = 1;                                                                                       \
    _Pragma("omp simd reduction(& : ok)")                                                             \
    for (long j = 0; j < k; j++) ok &= (w[j] >= 0) & (w[j] < (T)INFINITY);                            \
    return ok;                                                                                        \
}                                                                                                     \
                                                                                                      \
void sa_scale_rows_##SUFFIX(const T *G, T *out, long R, long k, const T *wrow, double f, int nthreads) { \
    const T fT = (T)f;                                                                                \
    _Pragma("omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1)")             \
    for (long r = 0; r < R; r++) {                                                                    \
        const T s = wrow ? fT * wrow[r] : fT;                                                         \
        const T *gr = G + r * k;                                                                      \
        T *o = out + r * k;                                                                           \
        _Pragma("omp simd")                                                                           \
        for (long j = 0; j < k; j++) o[j] = gr[j] * s;                                                \
    }                                                                                                 \
}

DEFINE_INDEX_SCALE(float, f32)
DEFINE_INDEX_SCALE(double, f64)

/* The Fenchel-Young loss of class indices, forward and gradient in one call
 * (softargmax.losses._index_loss): per row r with class c = target[r] and the target y = (1 - eps) e_c + eps/k
 * (eps = 0: no label smoothing), G_r = p_r - y (written where the solver writes p; ys = eps/k and
 * yc = 1 - eps + eps/k rounded to T by the caller, as the PyTorch path's target rows hold them), and the loss
 * with <z, y> = (1 - eps) z_c + (eps/k) sum_j z_j (the sum in double; eps = 1: the sum alone):
 *   KIND_POWER (alpha-entmax, sparsemax): max(0, (<z, p> - <z, y>) + (cy - sum_j [f(p_j) - f(0)])) in T, with
 *     every rounding of the PyTorch path (softargmax.losses._row_losses): <z, p> and the f-sum are the
 *     solver's double row sums rounded to T, <z, y> is z_c (smoothed: the double value rounded to T),
 *     cy = Omega(y) less the k f(0) terms (a constant: f(1) - f(0) for a one-hot y) is rounded to T by the
 *     caller;
 *   KIND_JS, KIND_HELL: max(0, (T)((Omega*(z) + cyd) - <z, y>)) with the row's conjugate (dense_conjugate)
 *     and cyd = cy in double, rounded once (as the PyTorch path forms it from Solution.omega_star);
 *   KIND_RKL, KIND_JEFF, KIND_RCHI (f(0) = +inf, eps = 0 only): 0 if c is the row's one unmasked class,
 *     else +inf.
 * weight (or NULL): per-class weights; the row's loss is then multiplied by w_c in T and w_c is written to
 * wrow[r] (0 in ignored rows), and the mean divides by the kept rows' weights' sum instead of their count.
 * Rows whose target is `ignore` get loss 0 and G = 0 and are not solved; rows with NaN or +inf get loss NaN
 * and G NaN.  `total` (reduction 1: the sum; 2: the mean, NaN where the denominator is 0): the sums are
 * accumulated in double and rounded once to T, the mean is their quotient in T; *den receives the mean's
 * denominator in double; `loss` may be NULL then
 * (the per-row values are not returned).  Returns the number of kept rows, -1 (no memory), or -2 - r with r
 * the first row whose class is outside [0, k) (checked first: nothing is written). */
#define DEFINE_INDEX_LOSS(T, SUFFIX)                                                              \
static void index_rows_##SUFFIX(const T *z, long r0, long r1, long k, int kind, double a,        \
                                const int64_t *target, int64_t ignore, double oc, double osc,    \
                                T cy, double cyd, double eps, T ys, T yc, const T *weight,       \
                                T *wrow, T *G, T *loss, double *buf, int32_t *idx, T *srow) {    \
    for (long r = r0; r < r1; r++) {                                                              \
        T *gr = G + r * k;                                                                        \
        const int64_t c = target[r];                                                              \
        if (c == ignore) {                                                                        \
            memset(gr, 0, (size_t)k * sizeof(T)); loss[r] = 0;                                    \
            if (wrow) wrow[r] = 0;                                                                \
            continue;                                                                             \
        }                                                                                         \
        const T *zr = z + r * k;                                                                  \
        double zy = (double)zr[c];                                                                \
        if (eps > 0) { /* <z, y> of the smoothed target, in double */                            \
            double sz = 0;                                                                        \
            _Pragma("omp simd reduction(+ : sz)")                                                 \
            for (long j = 0; j < k; j++) sz += (double)zr[j];                                     \
            zy = sz * (eps / (double)k);                                                          \
            if (eps < 1) zy += (double)zr[c] * (1.0 - eps); /* (eps = 1: no 0 * -inf) */           \
        }                                                                                         \
        int it = 0;                                                                               \
        T tau_r, ssum_r, l;                                                                       \
        double sums[2];                                                                           \
        if (kind == KIND_POWER) {                                                                 \
            row_power_##SUFFIX(zr, NULL, NULL, k, a, gr, srow, &tau_r, &ssum_r, buf, buf + k + PAD, NULL, idx, &it,\
                               sums, oc, osc);                                                    \
            l = ((T)sums[0] - (eps > 0 ? (T)zy : zr[c])) + (cy - (T)sums[1]);                     \
            l = l < 0 ? (T)0 : l; /* NaN stays NaN (rows with NaN or +inf: sums are NaN) */       \
        } else {                                                                                  \
            const int conj = kind == KIND_JS || kind == KIND_HELL;                               \
            const int st = row_dense_##SUFFIX(zr, k, kind, gr, srow, &tau_r, &ssum_r, buf,        \
                                              buf + k + PAD, &it, conj ? sums : NULL);            \
            if (st == 2) {                                                                        \
                l = (T)NAN;                                                                       \
            } else if (conj) {                                                                    \
                l = (T)((sums[0] + cyd) - zy);                                                    \
                l = l < 0 ? (T)0 : l;                                                             \
            } else { /* f(0) = +inf: Omega(e_c) is finite only with one unmasked class, then p = e_c */ \
                long n = 0;                                                                       \
                if (zr[c] > -INFINITY)                                                            \
                    for (long j = 0; j < k; j++) n += zr[j] > -INFINITY;                          \
                l = n == 1 ? (T)0 : (T)INFINITY;                                                  \
            }                                                                                     \
        }                                                                                         \
        if (eps > 0) {                                                                            \
            const T pc = gr[c];                                                                   \
            _Pragma("omp simd")                                                                   \
            for (long j = 0; j < k; j++) gr[j] = gr[j] - ys;                                      \
            gr[c] = pc - yc;                                                                      \
        } else {                                                                                  \
            gr[c] = gr[c] - (T)1;                                                                 \
        }                                                                                         \
        if (weight) { const T w = weight[c]; wrow[r] = w; l = l * w; }                           \
        loss[r] = l;                                                                              \
    }                                                                                             \
}                                                                                                 \
                                                                                                  \
long sa_index_loss_##SUFFIX(const T *z, long R, long k, int kind, double a, const int64_t *target, \
                            int64_t ignore, double oc, double osc, T cy, double cyd, double eps,  \
                            T ys, T yc, const T *weight, T *wrow, T *G, T *loss, T *total,        \
                            double *den, int reduction, int nthreads) {                           \
    long kept = 0;                                                                                \
    for (long r = 0; r < R; r++) {                                                                \
        const int64_t c = target[r];                                                              \
        if (c == ignore) continue;                                                                \
        if (c < 0 || c >= k) return -2 - r;                                                       \
        kept++;                                                                                   \
    }                                                                                             \
    /* loss NULL: the per-row values in a buffer of our own (a reduction needs no [R] tensor) */     \
    const int own_loss = loss == NULL;                                                            \
    if (own_loss && !(loss = (T *)malloc((size_t)(R > 0 ? R : 1) * sizeof(T)))) return -1;        \
    int failed = 0;                                                                               \
    const size_t bytes = (size_t)(2 * (k + PAD)) * sizeof(double) + (size_t)k * sizeof(T);        \
    if (nthreads <= 1) {                                                                          \
        double *buf = (double *)malloc(bytes);                                                    \
        int32_t *idx = (int32_t *)malloc((size_t)(k + PAD) * sizeof(int32_t));                    \
        if (!buf || !idx) failed = 1;                                                             \
        else index_rows_##SUFFIX(z, 0, R, k, kind, a, target, ignore, oc, osc, cy, cyd, eps, ys, yc, \
                                 weight, wrow, G, loss, buf, idx, (T *)(buf + 2 * (k + PAD)));     \
        free(buf);                                                                                \
        free(idx);                                                                                \
    } else {                                                                                      \
        _Pragma("omp parallel num_threads(nthreads) reduction(| : failed)")                       \
        {                                                                                         \
            double *buf = (double *)malloc(bytes);                                                \
            int32_t *idx = (int32_t *)malloc((size_t)(k + PAD) * sizeof(int32_t));                \
            const int ok = buf && idx;                                                            \
            if (!ok) failed = 1;                                                                  \
            _Pragma("omp for schedule(static)")                                                   \
            for (long r = 0; r < R; r++) {                                                        \
                if (!ok) continue;                                                                \
                index_rows_##SUFFIX(z, r, r + 1, k, kind, a, target, ignore, oc, osc, cy, cyd, eps, ys, \
                                    yc, weight, wrow, G, loss, buf, idx, (T *)(buf + 2 * (k + PAD))); \
            }                                                                                     \
            free(buf);                                                                            \
            free(idx);                                                                            \
        }                                                                                         \
    }                                                                                             \
    if (!failed) {                                                                                \
        double d = (double)kept;                                                                  \
        if (weight) { d = 0; for (long r = 0; r < R; r++) d += (double)wrow[r]; }                 \
        if (den) *den = d;                                                                        \
        if (reduction) {                                                                          \
            double s = 0;                                                                         \
            for (long r = 0; r < R; r++) s += (double)loss[r];                                    \
            /* the mean: both sums rounded to T, then divided in T (the PyTorch path's and               \
               F.cross_entropy's: a weights' sum past T's range gives 0, or NaN where the losses' also is) */ \
            *total = reduction == 2 ? (d == 0 ? (T)NAN : (T)s / (T)d) : (T)s;                     \
        }                                                                                         \
    }                                                                                             \
    if (own_loss) free(loss);                                                                     \
    return failed ? -1 : kept;                                                                    \
}

DEFINE_INDEX_LOSS(float, f32)
DEFINE_INDEX_LOSS(double, f64)
