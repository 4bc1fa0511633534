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

/* run chunks of a job until none is left (every participant, the caller included) */
static void pool_run(pool_job *job) {
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
}

/* ------------------------------------------------------------------------
 * The resident workers. Starting a thread per parallel_for cost tens of
 * microseconds and a cold stack each time, and a forward pass runs hundreds of
 * them (a decoded token too), so workers are started once, on first need, and
 * wait for jobs: each new job bumps a generation number; worker i takes part
 * when i < want. A worker that has just run a job spins briefly on the
 * generation before it sleeps (the next job of a forward pass follows within
 * microseconds); a job that does not want it sends it straight to sleep. Each
 * worker sleeps on a condition variable of its own and a job signals only the
 * workers it wants, so workers left over from a call with more threads stay
 * asleep (they neither wake nor spin for later, smaller jobs). The caller spins
 * briefly on the count of active workers before it sleeps. One job uses the workers at a time (pool_use); a call that finds
 * them busy (another thread's job, or a nested call) starts threads of its own
 * as before. A forked child starts with no workers (pthread_atfork). */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t done;
    pthread_cond_t wake[ORK_POOL_MAX_THREADS]; /* worker i sleeps on wake[i]; initialized when it starts */
    int nworkers;            /* started (under pool_use) */
    unsigned long gen;       /* under mu; also published in pub_gen */
    pool_job *job;
    int want;
} pool_state;

static pool_state P = {.mu = PTHREAD_MUTEX_INITIALIZER, .done = PTHREAD_COND_INITIALIZER};
static pthread_mutex_t pool_use = PTHREAD_MUTEX_INITIALIZER;
static atomic_ulong pub_gen;
static atomic_int active;      /* workers still in the current job */
static unsigned long start_gen[ORK_POOL_MAX_THREADS]; /* the generation when worker i was started */
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

#define POOL_SPIN 20000

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void *resident_worker(void *arg) {
    const int idx = (int)(intptr_t)arg;
    unsigned long seen = start_gen[idx]; /* the job being published next is new to it */
    for (;;) {
        /* hot: it has just run a job (or just started for one) */
        for (int s = 0; s < POOL_SPIN && atomic_load_explicit(&pub_gen, memory_order_acquire) == seen; s++) cpu_relax();
        pthread_mutex_lock(&P.mu);
        pool_job *job;
        for (;;) {
            if (P.gen != seen) {
                seen = P.gen;
                if (idx < P.want) {
                    job = P.job;
                    break;
                }
            }
            pthread_cond_wait(&P.wake[idx], &P.mu); /* a job that wants it signals wake[idx] */
        }
        pthread_mutex_unlock(&P.mu);
        pool_run(job);
        if (atomic_fetch_sub_explicit(&active, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&P.mu);
            pthread_cond_signal(&P.done);
            pthread_mutex_unlock(&P.mu);
        }
    }
    return NULL;
}

static void pool_after_fork_child(void) {
    /* the workers did not survive the fork: a fresh, empty pool */
    pthread_mutex_init(&P.mu, NULL);
    pthread_cond_init(&P.done, NULL); /* wake[i] is initialized again when worker i is started */
    P.nworkers = 0;
    P.gen = 0;
    P.job = NULL;
    P.want = 0;
    atomic_store(&pub_gen, 0);
    atomic_store(&active, 0);
    pthread_mutex_init(&pool_use, NULL);
}

static void pool_register_fork(void) { pthread_atfork(NULL, NULL, pool_after_fork_child); }

/* Worker threads get at least 1 MB of stack: kernels keep their decode-sized scratch on the stack
 * (scratch.h, tens of KB), and some C libraries default to 128 KB. */
#define POOL_MIN_STACK ((size_t)1 << 20)

static void stack_at_least(pthread_attr_t *at) {
    size_t sz = 0;
    if (pthread_attr_getstacksize(at, &sz) == 0 && sz < POOL_MIN_STACK) pthread_attr_setstacksize(at, POOL_MIN_STACK);
}

/* run job on the caller and `helpers` resident workers; 0 if the pool was busy (nothing run) */
static int pool_resident(pool_job *job, int helpers) {
    if (pthread_mutex_trylock(&pool_use) != 0) return 0;
    pthread_once(&fork_once, pool_register_fork);
    while (P.nworkers < helpers) {
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        stack_at_least(&at);
        start_gen[P.nworkers] = P.gen; /* stable: P.gen only moves under pool_use, which this call holds */
        pthread_cond_init(&P.wake[P.nworkers], NULL); /* no thread waits on it yet */
        int ok = pthread_create(&t, &at, resident_worker, (void *)(intptr_t)P.nworkers) == 0;
        pthread_attr_destroy(&at);
        if (!ok) break;
        P.nworkers++;
    }
    if (helpers > P.nworkers) helpers = P.nworkers; /* fewer started: the caller does more */
    atomic_store(&active, helpers);
    pthread_mutex_lock(&P.mu);
    P.job = job;
    P.want = helpers;
    P.gen++;
    atomic_store_explicit(&pub_gen, P.gen, memory_order_release);
    for (int i = 0; i < helpers; i++) pthread_cond_signal(&P.wake[i]); /* only the workers it wants */
    pthread_mutex_unlock(&P.mu);
    pool_run(job);
    for (int s = 0; s < POOL_SPIN && atomic_load_explicit(&active, memory_order_acquire) > 0; s++) cpu_relax();
    if (atomic_load_explicit(&active, memory_order_acquire) > 0) {
        pthread_mutex_lock(&P.mu);
        while (atomic_load_explicit(&active, memory_order_acquire) > 0) pthread_cond_wait(&P.done, &P.mu);
        pthread_mutex_unlock(&P.mu);
    }
    pthread_mutex_unlock(&pool_use);
    return 1;
}

static void *pool_worker(void *arg) {
    pool_run((pool_job *)arg);
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

    if (nthreads == 1) {
        pool_run(&job);
    } else if (!pool_resident(&job, nthreads - 1)) {
        pthread_t tids[ORK_POOL_MAX_THREADS];
        int started = 0;
        pthread_attr_t at;
        pthread_attr_init(&at);
        stack_at_least(&at);
        for (int t = 1; t < nthreads; t++) {
            if (pthread_create(&tids[started], &at, pool_worker, &job) != 0) break;
            started++;
        }
        pthread_attr_destroy(&at);
        /* The caller works too; if no thread could be started it does all the
         * work alone, which is slower but gives the same result. */
        pool_worker(&job);
        for (int t = 0; t < started; t++) pthread_join(tids[t], NULL);
    }
    pthread_mutex_destroy(&job.lock);

    if (job.fail_st != ORK_OK) {
        if (err) *err = job.fail_err;
        return job.fail_st;
    }
    return ORK_OK;
}
