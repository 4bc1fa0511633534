/* act_range.c - see act_range.h */
#include "act_range.h"

#include <math.h>

#include "pool.h"

static double sawtooth(double u) {
    const double k = floor(u + 0.5), r = u - k;
    return k >= 1.0 ? 1.0 / 24.0 + (k - 1.0) / 12.0 + (r * r * r + 0.125) / 3.0 : u * u * u / 3.0;
}

typedef struct {
    const double *count, *sum, *sum2, *edges, *clips;
    size_t nbins;
    double qmax;
    double *err;
} range_job;

static ork_status range_run(void *ctx, size_t begin, size_t end, ork_err *e) {
    (void)e;
    const range_job *j = (const range_job *)ctx;
    for (size_t i = begin; i < end; i++) {
        const double c = j->clips[i], d = c / j->qmax;
        double total = 0.0;
        for (size_t b = 0; b < j->nbins; b++) {
            const double n = j->count[b];
            if (!(n > 0.0)) continue;
            const double lo = j->edges[b], hi = isfinite(j->edges[b + 1]) ? j->edges[b + 1] : lo * 2.0;
            if (lo >= c) {
                const double a = j->sum2[b] - 2.0 * c * j->sum[b] + n * c * c;
                total += a > 0.0 ? a : 0.0;
                continue;
            }
            const double top = c < lo ? lo : (c > hi ? hi : c);
            const double frac = (top - lo) / (hi - lo);
            const double rounding = top > lo ? d * d * (sawtooth(top / d) - sawtooth(lo / d)) / ((top - lo) / d) : 0.0;
            const double straddle = (hi - top) * (hi - top) / 3.0;
            total += n * frac * rounding + n * (1.0 - frac) * straddle;
        }
        j->err[i] = total;
    }
    return ORK_OK;
}

ork_status ork_act_range_mse(const double *count, const double *sum, const double *sum2, const double *edges,
                             size_t nbins, const double *clips, size_t nclips, int qmax, double *err, int nthreads,
                             ork_err *err_out) {
    if (!count || !sum || !sum2 || !edges || (nclips && (!clips || !err)) || qmax < 1)
        return ork_err_set(err_out, ORK_EINVAL, "range_mse: bad arguments (qmax %d)", qmax);
    for (size_t i = 0; i < nclips; i++)
        if (!(clips[i] > 0.0) || !isfinite(clips[i]))
            return ork_err_set(err_out, ORK_EINVAL, "range_mse: clip %zu is %g, expected a finite number > 0", i,
                               clips[i]);
    for (size_t b = 0; b < nbins; b++)
        if (!(edges[b] >= 0.0) || !(edges[b + 1] > edges[b]))
            return ork_err_set(err_out, ORK_EINVAL, "range_mse: the bin edges must increase from 0 (bin %zu)", b);
    range_job j = {count, sum, sum2, edges, clips, nbins, (double)qmax, err};
    return ork_parallel_for(nthreads, nclips, 8, range_run, &j, err_out);
}
