/* gptq_impl.h - the factor and the rows of GPTQ (gptq.h) for one precision, included by gptq.c
 * once per precision with:
 *   GR      the real type (double, float)
 *   GW      the packed column width of its multiply-accumulate (4: quads, 8: octets)
 *   GX(n)   the instance's name of n (n##_d, n##_f)
 *   GACC    its kernel type (ork_gptq_acc_fn, ork_gptq_accf_fn), GACC_FOR its ISA lookup
 *   GSQRT   its square root (sqrt, sqrtf)
 * The double instance is the code the float64 contract was written from; the float one is the
 * same operations in float (gptq.h, "Precision"). Not a header of its own: no include guard. */

/* B (k x n, row stride ldb) packed by column groups of GW: B[p][c] at Bp[(c / GW) * ts + p * GW + c % GW],
 * ts = GW * k, the last group padded with zeros. */
static void GX(pack_b)(size_t k, size_t n, const GR *B, size_t ldb, GR *Bp) {
    for (size_t c0 = 0; c0 < n; c0 += GW)
        for (size_t p = 0; p < k; p++)
            for (size_t c = 0; c < GW; c++) Bp[c0 * k + p * GW + c] = c0 + c < n ? B[p * ldb + c0 + c] : (GR)0;
}

/* --------------------------------------------------- lower Cholesky of A -- */
typedef struct {
    GR *A;           /* K x K, lower triangle factored in place */
    size_t K, k0, k1;
    GR *T;           /* -A21^T packed (pack_b layout, group stride GW nbk): -A[j][k0 + p] for j >= k1 */
    GR *LT;          /* nbk x nbk: L[j'][j] at LT[j - k0][j' - k0] */
    GACC acc;
} GX(chol_job);

static ork_status GX(chol_trsm)(void *ctx, size_t b, size_t e, ork_err *err) {
    (void)err;
    const GX(chol_job) *c = (const GX(chol_job) *)ctx;
    const size_t K = c->K, k0 = c->k0, nbk = c->k1 - k0;
    for (size_t i = c->k1 + b; i < c->k1 + e; i++) {
        GR *a = c->A + i * K + k0;
        for (size_t j = 0; j < nbk; j++) {
            const GR x = a[j] / c->A[(k0 + j) * K + k0 + j];
            a[j] = x;
            const GR *lt = c->LT + j * NB;
            for (size_t j2 = j + 1; j2 < nbk; j2++) a[j2] -= x * lt[j2];
        }
        GR *t = c->T + ((i - c->k1) / GW) * GW * nbk + (i - c->k1) % GW;
        for (size_t j = 0; j < nbk; j++) t[j * GW] = -a[j];
    }
    return ORK_OK;
}

static ork_status GX(chol_syrk)(void *ctx, size_t b, size_t e, ork_err *err) {
    (void)err;
    const GX(chol_job) *c = (const GX(chol_job) *)ctx;
    const size_t K = c->K, k0 = c->k0, k1 = c->k1;
    /* rows k1+b .. k1+e-1, columns k1 .. k1+e-1 (the strict upper part of the last rows is scratch) */
    c->acc(e - b, e, k1 - k0, c->A + (k1 + b) * K + k0, K, c->T, GW * (k1 - k0), c->A + (k1 + b) * K + k1, K);
    return ORK_OK;
}

/* A: K x K, lower triangle; on success L with A = L L^T in the lower triangle. */
static ork_status GX(chol_lower)(GR *A, size_t K, int nthreads, GR *T, GR *LT, double damp, ork_err *err) {
    for (size_t k0 = 0; k0 < K; k0 += NB) {
        const size_t k1 = K - k0 < NB ? K : k0 + NB, nbk = k1 - k0;
        for (size_t j = k0; j < k1; j++) { /* the diagonal block, right-looking */
            const GR d = A[j * K + j];
            if (!(d > (GR)0) || !isfinite(d))
                return ork_err_set(err, ORK_EINVAL, "the Gram matrix plus damping is not positive definite "
                                   "(raise damp, now %g)", damp);
            const GR l = GSQRT(d);
            A[j * K + j] = l;
            for (size_t i = j + 1; i < k1; i++) A[i * K + j] /= l;
            for (size_t i = j + 1; i < k1; i++) {
                const GR x = A[i * K + j];
                for (size_t j2 = j + 1; j2 <= i; j2++) A[i * K + j2] -= x * A[j2 * K + j];
            }
        }
        if (k1 == K) break;
        for (size_t j = 0; j < nbk; j++)
            for (size_t j2 = j + 1; j2 < nbk; j2++) LT[j * NB + j2] = A[(k0 + j2) * K + k0 + j];
        GX(chol_job) c = {A, K, k0, k1, T, LT, GACC_FOR(ork_cpu_isa())};
        const size_t M = K - k1;
        const int th = ork_pool_threads_for(nthreads, (double)M * (double)M * (double)nbk, 1 << 21);
        ork_status st = ork_parallel_for(th, M, 16, GX(chol_trsm), &c, err);
        if (st == ORK_OK) st = ork_parallel_for(th, M, 32, GX(chol_syrk), &c, err);
        if (st != ORK_OK) return st;
    }
    return ORK_OK;
}

/* ------------------------------------------- X = L^-1, one block column each -- */
typedef struct {
    const GR *L;
    GR *X;
    size_t K;
    GACC acc;
} GX(inv_job);

static ork_status GX(inv_cols)(void *ctx, size_t b, size_t e, ork_err *err) {
    const GX(inv_job) *v = (const GX(inv_job) *)ctx;
    const size_t K = v->K;
    GR *Bp = (GR *)malloc(NB * (NB + GW) * sizeof(GR));
    if (!Bp) return ork_err_set(err, ORK_ENOMEM, "out of memory (GPTQ factorization workspace)");
    for (size_t J = b; J < e; J++) {
        const size_t j0 = J * NB, w = K - j0 < NB ? K - j0 : NB;
        for (size_t i = j0; i < K; i++) memset(v->X + i * K + j0, 0, w * sizeof(GR));
        for (size_t i0 = j0; i0 < K; i0 += NB) {
            const size_t i1 = K - i0 < NB ? K : i0 + NB;
            for (size_t i = i0; i < i1; i++) { /* the running sums of rows i0.. hold the earlier blocks' terms */
                GR *x = v->X + i * K + j0;
                const GR lii = v->L[i * K + i];
                for (size_t c = 0; c < w; c++) x[c] = ((i == j0 + c ? (GR)1 : (GR)0) - x[c]) / lii;
                for (size_t i2 = i + 1; i2 < i1; i2++) {
                    const GR l = v->L[i2 * K + i];
                    GR *y = v->X + i2 * K + j0;
                    for (size_t c = 0; c < w; c++) y[c] += l * x[c];
                }
            }
            if (i1 < K) {
                GX(pack_b)(i1 - i0, w, v->X + i0 * K + j0, K, Bp);
                v->acc(K - i1, w, i1 - i0, v->L + i1 * K + i0, K, Bp, GW * (i1 - i0), v->X + i1 * K + j0, K);
            }
        }
    }
    free(Bp);
    return ORK_OK;
}

/* A: the reversed matrix (P H P), destroyed. u: U = P L^-1 P in its upper triangle. */
static ork_status GX(factor_rev)(GR *A, size_t K, int nthreads, double damp, GR *u, ork_err *err) {
    GR *T = (GR *)malloc((NB * (K + GW) + NB * NB) * sizeof(GR));
    if (!T) return ork_err_set(err, ORK_ENOMEM, "out of memory (GPTQ factorization workspace, K = %zu)", K);
    ork_status st = GX(chol_lower)(A, K, nthreads, T, T + NB * (K + GW), damp, err);
    free(T);
    if (st != ORK_OK) return st;
    GX(inv_job) v = {A, u, K, GACC_FOR(ork_cpu_isa())};
    const size_t nblk = (K + NB - 1) / NB;
    st = ork_parallel_for(ork_pool_threads_for(nthreads, (double)K * K * K, 1 << 22), nblk, 1, GX(inv_cols), &v, err);
    if (st != ORK_OK) return st;
    /* U[a][b] = X[K-1-a][K-1-b]: the lower triangle (sources) never overlaps the strict upper (targets) */
    for (size_t i = 0; i < K; i++)
        for (size_t j = 0; j < i; j++) u[(K - 1 - i) * K + (K - 1 - j)] = u[i * K + j];
    for (size_t i = 0; i < K / 2; i++) {
        const GR t = u[i * K + i];
        u[i * K + i] = u[(K - 1 - i) * K + (K - 1 - i)];
        u[(K - 1 - i) * K + (K - 1 - i)] = t;
    }
    return ORK_OK;
}

/* ------------------------------------------------------------- the rows -- */
typedef struct {
    const float *w;
    size_t N, K;
    const GR *u;
    const GR *up; /* per block [i1, i2) of `block` columns: U[i1..i2, i2..K) packed (pack_b) */
    const ork_gptq_params *p;
    ork_quant_params qp; /* kind, imatrix (4-bit), group: ork_quant_segment_scale's view */
    const ork_kind_info *info;
    const uint8_t *dead;
    size_t gs, G, block;
    uint8_t *codes;
    float *scales;
    size_t row_bytes;
    GACC acc;
} GX(gptq_job);

typedef struct {
    float s, inv, o; /* o: the affine offset (0 for symmetric scales) */
    GR invd;
} GX(seg_sc);

/* the scale of group g of row n from float32() of its R-row state W (row stride K) */
static ork_status GX(pick_scale)(const GX(gptq_job) *j, const GR *wrow, const float *w32, size_t n, size_t g,
                                 float *x32, GX(seg_sc) *out, ork_err *err) {
    const size_t c0 = g * j->gs, len = j->K - c0 < j->gs ? j->K - c0 : j->gs;
    const float *x = w32;
    if (wrow) {
        for (size_t c = 0; c < len; c++) x32[c] = (float)wrow[c0 + c];
        x = x32;
    } else {
        x = w32 + c0;
    }
    float s, inv, o = 0.0f;
    ork_status st = j->p->offsets ? ork_quant_segment_affine(x, j->qp.imatrix ? j->qp.imatrix + c0 : NULL, len, n, c0,
                                                             j->gs, &s, &inv, &o, err)
                                  : ork_quant_segment_scale(&j->qp, j->K, n, c0, x, len, &s, &inv, err);
    if (st != ORK_OK) return st;
    j->scales[n * j->G + g] = s;
    if (j->p->offsets) j->p->offsets[n * j->G + g] = o;
    out->s = s;
    out->inv = inv;
    out->o = o;
    out->invd = s > 0.0f ? (GR)1 / (GR)s : (GR)0;
    return ORK_OK;
}

static ork_status GX(gptq_rows)(void *ctx, size_t r0, size_t r1, ork_err *err) {
    const GX(gptq_job) *j = (const GX(gptq_job) *)ctx;
    const size_t K = j->K, R = r1 - r0, B = j->block, gs = j->gs, G = j->G;
    const int four = j->info->bits == 4;
    const ork_q4_grid *grid = &j->info->grid;
    const uint8_t zero = j->info->zero_code;
    GR *W = (GR *)malloc(R * K * sizeof(GR));
    GR *E = (GR *)malloc(R * B * sizeof(GR));
    GX(seg_sc) *sc = (GX(seg_sc) *)malloc(R * G * sizeof(GX(seg_sc)));
    float *x32 = (float *)malloc(gs * sizeof(float));
    ork_status st = ORK_OK;
    if (!W || !E || !sc || !x32) {
        st = ork_err_set(err, ORK_ENOMEM, "out of memory (GPTQ row workspace, %zu x %zu values)", R, K);
        goto done;
    }
    for (size_t r = 0; r < R; r++) {
        const float *src = j->w + (r0 + r) * K;
        for (size_t k = 0; k < K; k++) W[r * K + k] = (GR)src[k];
        if (four) memset(j->codes + (r0 + r) * j->row_bytes, zero | (zero << 4), j->row_bytes);
        for (size_t g = 0; g < G && (j->p->static_groups || g == 0); g++)
            if ((st = GX(pick_scale)(j, NULL, src, r0 + r, g, x32, &sc[r * G + g], err)) != ORK_OK) goto done;
    }
    const GR *up = j->up; /* this block's panel U[i1..i2, i2..K), packed */
    for (size_t i1 = 0; i1 < K; i1 += B) {
        const size_t i2 = K - i1 < B ? K : i1 + B;
        size_t f = i1; /* errors of columns [f, k) not yet pushed onto [i2, K) */
        for (size_t k = i1; k < i2; k++) {
            const size_t g = k / gs;
            if (k % gs == 0 && k > 0 && !j->p->static_groups) {
                const size_t end = K - k < gs ? K : k + gs;
                if (end > i2 && k > f) { /* the group reaches past the block: bring it up to date first */
                    j->acc(R, K - i2, k - f, E + (f - i1), B, up + (f - i1) * GW, GW * (i2 - i1), W + i2, K);
                    f = k;
                }
                for (size_t r = 0; r < R; r++)
                    if ((st = GX(pick_scale)(j, W + r * K, NULL, r0 + r, g, x32, &sc[r * G + g], err)) != ORK_OK)
                        goto done;
            }
            const GR *uk = j->u + k * K;
            for (size_t r = 0; r < R; r++) {
                GR *wr = W + r * K;
                const GX(seg_sc) *s = &sc[r * G + g];
                const GR x = wr[k];
                GR val;
                if (four) {
                    int c = zero;
                    if (s->s > 0.0f) {
                        const GR y = x * s->invd;
                        c = 0;
                        for (int t = 0; t < grid->nlev - 1; t++) c += (y >= (GR)grid->thr[t]);
                    }
                    uint8_t *byte = j->codes + (r0 + r) * j->row_bytes + (k >> 1);
                    *byte = (k & 1) ? (uint8_t)((*byte & 0x0f) | (c << 4)) : (uint8_t)((*byte & 0xf0) | c);
                    val = (GR)grid->lev[c] * (GR)s->s;
                } else if (j->p->offsets) {
                    const float q = ork_affine_code((float)x, s->inv, s->o);
                    ((int8_t *)j->codes)[(r0 + r) * j->row_bytes + k] = (int8_t)q;
                    val = (GR)q * (GR)s->s + (GR)s->o;
                } else {
                    const float q = ork_clamp_lim(ork_round_half_away((float)x * s->inv), (float)j->info->qmax);
                    ((int8_t *)j->codes)[(r0 + r) * j->row_bytes + k] = (int8_t)q;
                    val = (GR)q * (GR)s->s;
                }
                GR e = (GR)0;
                if (!j->dead[k]) {
                    e = (x - val) / uk[k];
                    for (size_t c = k + 1; c < i2; c++) wr[c] -= e * uk[c];
                }
                E[r * B + (k - i1)] = -e;
            }
        }
        if (i2 < K) j->acc(R, K - i2, i2 - f, E + (f - i1), B, up + (f - i1) * GW, GW * (i2 - i1), W + i2, K);
        up += (i2 - i1) * GW * ((K - i2 + GW - 1) / GW);
    }
done:
    free(W);
    free(E);
    free(sc);
    free(x32);
    return st;
}

/* The factor and the rows from A = P H' P (K x K of GR, lower triangle; destroyed: the factor,
 * then U's packed panels in its place, reallocated when they outgrow it -- *A updated, *own set).
 * U: K x K of GR, the caller's. */
static ork_status GX(gptq_finish)(const float *w, size_t N, size_t K, GR **A, int *own, GR *U, const uint8_t *dead,
                                  const float *im, const ork_gptq_params *p, void *codes, float *scales, ork_err *err) {
    const ork_kind_info *info = ork_kind_get(p->kind);
    const size_t gs = p->group && p->group < K ? p->group : K;
    ork_status st = GX(factor_rev)(*A, K, p->nthreads, p->damp, U, err);
    if (st != ORK_OK) return st;
    const size_t B = p->block < K ? p->block : K;
    size_t need = 0; /* the packed panels, in A's place when they fit */
    for (size_t i1 = 0; i1 < K; i1 += B) {
        const size_t i2 = K - i1 < B ? K : i1 + B;
        need += (i2 - i1) * GW * ((K - i2 + GW - 1) / GW);
    }
    if (need > K * K) {
        if (*own) free(*A);
        *own = 1;
        if (!(*A = (GR *)malloc(need * sizeof(GR))))
            return ork_err_set(err, ORK_ENOMEM, "out of memory (GPTQ: %zu values)", need);
    }
    for (size_t i1 = 0, off = 0; i1 < K; i1 += B) {
        const size_t i2 = K - i1 < B ? K : i1 + B;
        GX(pack_b)(i2 - i1, K - i2, U + i1 * K + i2, K, *A + off);
        off += (i2 - i1) * GW * ((K - i2 + GW - 1) / GW);
    }
    GX(gptq_job) j;
    memset(&j, 0, sizeof j);
    j.w = w;
    j.N = N;
    j.K = K;
    j.u = U;
    j.up = *A;
    j.p = p;
    j.qp.kind = p->kind;
    j.qp.imatrix = im;
    j.qp.group = gs < K ? gs : 0;
    j.qp.nthreads = 1;
    j.info = info;
    j.dead = dead;
    j.gs = gs;
    j.G = (K + gs - 1) / gs;
    j.block = B;
    j.codes = (uint8_t *)codes;
    j.scales = scales;
    j.row_bytes = ork_quant_row_bytes(p->kind, K);
    j.acc = GACC_FOR(ork_cpu_isa());
    return ork_parallel_for(ork_pool_threads_for(p->nthreads, (double)N * K * K, 1 << 22), N, RB, GX(gptq_rows), &j,
                            err);
}
