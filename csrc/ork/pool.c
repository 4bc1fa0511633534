#include "pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ORK_POOL_MAX_THREADS 256

typedef struct {
    ork_range_fn fn;
    void *ctx;
    size_t n, chunk;
    atomic_size_t next;
    pthread_mutex_t lock;
    size_t fail_begin; /* SIZE_MAX while no chunk has failed */
    ork_status fail_st;
    ork_err fail_err;
} pool_job;

int ork_pool_default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > ORK_POOL_MAX_THREADS) n = ORK_POOL_MAX_THREADS;
    return (int)n;
}

int ork_pool_threads_for(int nthreads, double work, double min_per_thread) {
    int n = nthreads <= 0 ? ork_pool_default_threads() : nthreads;
    double fit = min_per_thread > 0 ? work / min_per_thread : (double)n;
    if (fit < 1.0) return 1;
    return fit < (double)n ? (int)fit : n;
}

static void *pool_worker(void *arg) {
    pool_job *job = (pool_job *)arg;
    for (;;) {
        size_t b = atomic_fetch_add(&job->next, job->chunk);
        if (b >= job->n) break;
        size_t e = (job->n - b < job->chunk) ? job->n : b + job->chunk;
        ork_err local;
        local.msg[0] = '\0';
        ork_status st = job->fn(job->ctx, b, e, &local);
        if (st != ORK_OK) {
            pthread_mutex_lock(&job->lock);
            if (b < job->fail_begin) {
                job->fail_begin = b;
                job->fail_st = st;
                job->fail_err = local;
            }
            pthread_mutex_unlock(&job->lock);
        }
    }
    return NULL;
}

ork_status ork_parallel_for(int nthreads, size_t n, size_t chunk, ork_range_fn fn, void *ctx,
                            ork_err *err) {
    if (!fn) return ork_err_set(err, ORK_EINVAL, "parallel_for: no function");
    if (n == 0) return ORK_OK;
    if (chunk == 0) chunk = 1;
    if (nthreads <= 0) nthreads = ork_pool_default_threads();
    if (nthreads > ORK_POOL_MAX_THREADS) nthreads = ORK_POOL_MAX_THREADS;
    size_t nchunks = (n + chunk - 1) / chunk;
    if ((size_t)nthreads > nchunks) nthreads = (int)nchunks;

    pool_job job;
    job.fn = fn;
    job.ctx = ctx;
    job.n = n;
    job.chunk = chunk;
    atomic_init(&job.next, 0);
    pthread_mutex_init(&job.lock, NULL);
    job.fail_begin = SIZE_MAX;
    job.fail_st = ORK_OK;
    job.fail_err.msg[0] = '\0';

    pthread_t tids[ORK_POOL_MAX_THREADS];
    int started = 0;
    for (int t = 1; t < nthreads; t++) {
        if (pthread_create(&tids[started], NULL, pool_worker, &job) != 0) break;
        started++;
    }
    /* The caller works too; if no thread could be started it does all the
     * work alone, which is slower but gives the same result. */
    pool_worker(&job);
    for (int t = 0; t < started; t++) pthread_join(tids[t], NULL);
    pthread_mutex_destroy(&job.lock);

    if (job.fail_st != ORK_OK) {
        if (err) *err = job.fail_err;
        return job.fail_st;
    }
    return ORK_OK;
}
