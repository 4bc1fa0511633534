/* gptq_oracle.h - GPTQ by its contract (gptq.h), written from the contract alone, for one
 * precision: included by test_gptq.c with OR (double, float), OX(n) (n##_d, n##_f) and OSQRT.
 * No include guard: one copy per precision. */
/* u (K x K, upper triangle) = the upper Cholesky factor of inv(h) as gptq.h step 2 spells it:
 * A = P h P, lower Cholesky right-looking, X = L^-1 by forward substitution (sums in p ascending),
 * U = P X P. 0 when h is not positive definite. */
static int OX(oracle_factor)(const double *h, size_t K, OR *u) {
    OR *A = calloc(K * K, sizeof(OR)), *X = calloc(K * K, sizeof(OR));
    int ok = 1;
    for (size_t i = 0; i < K; i++)
        for (size_t j = 0; j <= i; j++) A[i * K + j] = h[(K - 1 - i) * K + (K - 1 - j)];
    for (size_t j = 0; j < K && ok; j++) {
        if (!(A[j * K + j] > (OR)0)) {
            ok = 0;
            break;
        }
        const OR l = OSQRT(A[j * K + j]);
        A[j * K + j] = l;
        for (size_t i = j + 1; i < K; i++) A[i * K + j] /= l;
        for (size_t i = j + 1; i < K; i++)
            for (size_t j2 = j + 1; j2 <= i; j2++) A[i * K + j2] -= A[i * K + j] * A[j2 * K + j];
    }
    for (size_t c = 0; c < K && ok; c++)
        for (size_t i = c; i < K; i++) {
            OR s = 0;
            for (size_t p = c; p < i; p++) s += A[i * K + p] * X[p * K + c];
            X[i * K + c] = ((OR)(i == c ? 1 : 0) - s) / A[i * K + i];
        }
    for (size_t a = 0; a < K && ok; a++)
        for (size_t b = 0; b < K; b++) u[a * K + b] = b >= a ? X[(K - 1 - a) * K + (K - 1 - b)] : (OR)0;
    free(A);
    free(X);
    return ok;
}

/* ork_gptq's codes and scales by the contract, one row at a time, every error pushed at once */
static int OX(oracle_gptq)(const float *w, size_t N, size_t K, const double *gram, const ork_gptq_params *p,
                       uint8_t *codes, float *scales) {
    const ork_kind_info *info = ork_kind_get(p->kind);
    const size_t gs = p->group && p->group < K ? p->group : K, G = (K + gs - 1) / gs;
    const size_t rb = ork_quant_row_bytes(p->kind, K);
    double *h = malloc(K * K * sizeof(double));
    OR *u = malloc(K * K * sizeof(OR)), *wr = malloc(K * sizeof(OR));
    float *im = NULL, *x32 = malloc(K * sizeof(float)), *inv = malloc(G * sizeof(float));
    int ok = 1;
    double mean = 0.0;
    for (size_t k = 0; k < K; k++) mean += gram[k * K + k] == 0.0 ? 1.0 : gram[k * K + k];
    mean /= (double)K;
    memcpy(h, gram, K * K * sizeof(double));
    for (size_t k = 0; k < K; k++) h[k * K + k] = (gram[k * K + k] == 0.0 ? 1.0 : gram[k * K + k]) + p->damp * mean;
    if (!OX(oracle_factor)(h, K, u)) {
        ok = 0;
        goto done;
    }
    if ((info->bits == 4 || info->qmax < 127) && p->rows > 0) {
        int any = 0;
        im = malloc(K * sizeof(float));
        for (size_t k = 0; k < K; k++) any |= (im[k] = (float)(gram[k * K + k] / (double)p->rows)) > 0.0f;
        if (!any) {
            free(im);
            im = NULL;
        }
    }
    ork_quant_params qp;
    memset(&qp, 0, sizeof qp);
    qp.kind = p->kind;
    qp.imatrix = im;
    qp.group = gs < K ? gs : 0;
    qp.nthreads = 1;
    for (size_t n = 0; n < N; n++) {
        for (size_t k = 0; k < K; k++) wr[k] = (OR)w[n * K + k];
        if (info->bits == 4) memset(codes + n * rb, info->zero_code | (info->zero_code << 4), rb);
        for (size_t k = 0; k < K; k++) {
            const size_t g = k / gs;
            if (k % gs == 0) { /* the group's scale: from W (static, or the first group), else from the state */
                const size_t len = K - k < gs ? K - k : gs;
                for (size_t c = 0; c < len; c++)
                    x32[c] = p->static_groups || g == 0 ? w[n * K + k + c] : (float)wr[k + c];
                ork_err err;
                if (ork_quant_segment_scale(&qp, K, n, k, x32, len, &scales[n * G + g], &inv[g], &err) != ORK_OK) {
                    ok = 0;
                    goto done;
                }
            }
            const float s = scales[n * G + g];
            OR val;
            if (info->bits == 4) { /* the nearest LUT level of w / s, a tie to the upper one */
                int c = info->zero_code;
                if (s > 0.0f) {
                    const OR y = wr[k] * ((OR)1 / (OR)s);
                    c = 0;
                    for (int t = 0; t + 1 < info->nlev; t++)
                        if (y >= (OR)(((double)info->lut[t] + (double)info->lut[t + 1]) / 2.0)) c = t + 1;
                }
                uint8_t *byte = codes + n * rb + k / 2;
                *byte = k % 2 ? (uint8_t)((*byte & 0x0f) | (c << 4)) : (uint8_t)((*byte & 0xf0) | c);
                val = (OR)info->lut[c] * (OR)s;
            } else { /* round half away from zero (roundf), clamped to +-qmax */
                float q = roundf((float)wr[k] * inv[g]);
                q = q > (float)info->qmax ? (float)info->qmax : q < -(float)info->qmax ? -(float)info->qmax : q;
                ((int8_t *)codes)[n * rb + k] = (int8_t)q;
                val = (OR)q * (OR)s;
            }
            if (gram[k * K + k] == 0.0) continue; /* a dead column moves no error */
            const OR e = (wr[k] - val) / u[k * K + k];
            for (size_t j = k + 1; j < K; j++) wr[j] -= e * u[k * K + j];
        }
    }
done:
    free(h); free(u); free(wr); free(im); free(x32); free(inv);
    return ok;
}

