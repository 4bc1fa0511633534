/* act_range.h - the squared error of static activation ranges from an |x| histogram.
 *
 * Contract (orkpy/runtime/actcal.py "range_mse" states the model): the histogram's bins
 * (linear.h: count, sum |x|, sum x^2 per bin; bin b spans [edge(b), edge(b + 1)), the last bin
 * open: its values taken within [lo, 2 lo)). For each range c of `clips` on a grid of
 * +-qmax steps (d = c / qmax), err[i] = the sum over bins with count > 0, in bin order, of
 *   lo >= c:  max(sum2 - 2 c sum + n c^2, 0)            (every value saturates: exact)
 *   else:     n f r + n (1 - f) (hi' - t)^2 / 3         t = min(max(c, lo), hi'), f = (t - lo) / (hi' - lo),
 *             r = d^2 (S(t / d) - S(lo / d)) / ((t - lo) / d) when t > lo, else 0,
 * S(u) the integral over [0, u] of (v - round(v))^2 (rounding half up):
 *   k = floor(u + 1/2), rr = u - k:  k >= 1: 1/24 + (k - 1)/12 + (rr^3 + 1/8)/3;  else u^3 / 3.
 * All in double, each range's sum in bin order: the result never depends on the thread count.
 * ork_act_range_mse_ref is the one implementation (scalar; the ranges are split over threads). */
#ifndef ORK_ACT_RANGE_H
#define ORK_ACT_RANGE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* err[nclips] of the histogram (nbins bins, edges[nbins + 1], the last +inf) for clips[nclips] > 0
 * and qmax >= 1; ORK_EINVAL for a bad argument. */
ork_status ork_act_range_mse(const double *count, const double *sum, const double *sum2, const double *edges,
                             size_t nbins, const double *clips, size_t nclips, int qmax, double *err, int nthreads,
                             ork_err *err_out);

#endif
