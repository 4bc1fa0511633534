/* pool.h - a small fork/join pthread pool for row-parallel work.
 *
 * ork_parallel_for splits [0, n) into chunks of `chunk` items and runs
 * fn(ctx, begin, end, err) on up to `nthreads` threads (the caller's thread is
 * one of them). Work items must be independent, so results never depend on
 * the thread count. If chunks fail, the status and message of the failing
 * chunk with the LOWEST begin index is returned, so even errors are
 * deterministic across thread counts.
 *
 * The helper threads are resident (pool.c): started on first need and kept,
 * waiting between jobs; one job uses them at a time, and a call that finds
 * them busy (another thread's job, or a call from inside a job) starts threads
 * of its own for that call. A forked child starts with none.
 */
#ifndef ORK_POOL_H
#define ORK_POOL_H

#include <stddef.h>

#include "status.h"

typedef ork_status (*ork_range_fn)(void *ctx, size_t begin, size_t end, ork_err *err);

/* Number of online CPUs (>= 1). */
int ork_pool_default_threads(void);

/* Threads worth starting for `work` units (e.g. multiply-adds) when each
 * thread should get at least `min_per_thread` of them: between 1 and the
 * requested count (<= 0: all cores). Results never depend on it. */
int ork_pool_threads_for(int nthreads, double work, double min_per_thread);

/* nthreads <= 0 means ork_pool_default_threads(). chunk 0 means 1. */
ork_status ork_parallel_for(int nthreads, size_t n, size_t chunk, ork_range_fn fn, void *ctx,
                            ork_err *err);

#endif
