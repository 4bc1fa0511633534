/* device.c - see device.h. */
#include "device.h"

#include "../pack.h"

#include <stdatomic.h>

static _Atomic(const ork_npu_test_kernel *) g_test_kernel = NULL;

ork_status ork_npu_test_kernel_install(const ork_npu_test_kernel *k, ork_err *err) {
    if (k && (k->abi != ORK_NPU_TEST_KERNEL_ABI || k->size != sizeof *k || !k->open || !k->free || !k->set_faults ||
              !k->get_stats || !k->last_error || !k->trace))
        return ork_err_set(err, ORK_EINVAL, "npu: the test kernel table has ABI %u / size %u, this build expects %u / %zu",
                           k->abi, k->size, ORK_NPU_TEST_KERNEL_ABI, sizeof *k);
    atomic_store(&g_test_kernel, k);
    return ORK_OK;
}

const ork_npu_test_kernel *ork_npu_test_kernel_installed(void) { return atomic_load(&g_test_kernel); }

ork_status ork_npu_test_kernel_open(ork_npu_backend_kind kind, const ork_npu_test_kernel **k, void **fake,
                                    const ork_npu_sys **sys, ork_err *err) {
    *k = NULL;
    *fake = NULL;
    *sys = NULL;
    if (kind != ORK_NPU_BE_RKNPU && kind != ORK_NPU_BE_ROCKET)
        return ork_err_set(err, ORK_EINVAL, "npu: the %s backend has no kernel driver to fake",
                           (int)kind >= 0 && (int)kind < ORK_NPU_BE_COUNT ? ork_npu_backend_names[kind] : "unknown");
    const ork_npu_test_kernel *t = atomic_load(&g_test_kernel);
    if (!t)
        return ork_err_set(err, ORK_EUNAVAIL,
                           "npu: fake_kernel is test machinery that the shipped extension does not contain: build "
                           "tests/npu_fake (tests/cbuild.py build_fake_kernel) and load it with "
                           "orkpy.runtime.npu.load_fake_kernel(path) first");
    ork_status st = t->open(kind, fake, sys, err);
    if (st == ORK_OK) *k = t;
    return st;
}

/* ------------------------------------------------------------ devices --- */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ork_npu_dweight {
    ork_npu_device *dev;
    ork_npu_weight w;
    uint32_t N, K, addr; /* as uploaded: set before the weight is handed out, never written after (read without */
    uint64_t nbytes;     /* the lock; a close zeroes w.bo under it) */
    int split;           /* 1: an int4 weight from a store, whose matmuls take int8 codes (run_weight's digit rows);
                            0: int8 weights and int4 code arrays. Set at upload like N and K */
    uint32_t groups;     /* G = ceil(K / group) of a grouped upload (opts.group: outputs (G, M, N)), else 1 */
    int live;            /* 0 once the device closed (its buffer is gone) */
    /* the hook's cached jobs (M == 0: empty slot); they borrow w. Guarded by the device's lock, freed
     * before w (release, and the device's close) */
    ork_npu_job jobs[ORK_NPU_JOB_CACHE_SLOTS];
};

struct ork_npu_djob {
    ork_npu_device *dev;
    ork_npu_job j;
    uint32_t n, M, tasks; /* as planned: set before the job is handed out, never written after (read without */
    uint64_t cmd_bytes;   /* the lock; a close zeroes j under it) */
    int live;
};

struct ork_npu_device {
    pthread_mutex_t lock; /* a device is used by one thread at a time (backend.h) */
    ork_npu_dev *dev;     /* NULL once closed */
    const ork_npu_test_kernel *fk;
    void *fake; /* the fake kernel (tests), or NULL */
    uint32_t timeout_ms;
    ork_npu_dweight **weights; /* live weights (each removes itself when released) */
    size_t n_weights, cap_weights;
    ork_npu_djob **jobs; /* live jobs, likewise */
    size_t n_jobs, cap_jobs;
};

static int list_add(void ***list, size_t *n, size_t *cap, void *item) {
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 16;
        void **nl = (void **)realloc(*list, c * sizeof *nl);
        if (!nl) return -1;
        *list = nl;
        *cap = c;
    }
    (*list)[(*n)++] = item;
    return 0;
}

static void list_remove(void **list, size_t *n, const void *item) {
    for (size_t i = 0; i < *n; i++)
        if (list[i] == item) {
            list[i] = list[--*n];
            return;
        }
}

ork_status ork_npu_device_open(ork_npu_backend_kind kind, int fake, uint32_t emu_base, uint32_t timeout_ms,
                               ork_npu_device **out, ork_err *err) {
    *out = NULL;
    if (timeout_ms == 0) return ork_err_set(err, ORK_EINVAL, "timeout_ms must be > 0");
    ork_npu_device *d = (ork_npu_device *)calloc(1, sizeof *d);
    if (!d) return ork_err_set(err, ORK_ENOMEM, "npu: out of memory");
    if (pthread_mutex_init(&d->lock, NULL)) {
        free(d);
        return ork_err_set(err, ORK_ENOMEM, "npu: cannot create the device lock");
    }
    d->timeout_ms = timeout_ms;
    const ork_npu_sys *sys = NULL;
    ork_status st = fake ? ork_npu_test_kernel_open(kind, &d->fk, &d->fake, &sys, err) : ORK_OK;
    if (st == ORK_OK) st = ork_npu_dev_open(kind, sys, emu_base, &d->dev, err);
    if (st != ORK_OK) {
        ork_npu_device_free(d);
        return st;
    }
    *out = d;
    return ORK_OK;
}

/* free the hook's cached jobs of a weight (their device buffers when the device is open; closed: host
 * memory only); with the lock held */
static void drop_cached_jobs(ork_npu_device *d, ork_npu_dweight *w) {
    for (int i = 0; i < ORK_NPU_JOB_CACHE_SLOTS; i++)
        if (w->jobs[i].M) ork_npu_job_free(d->dev, &w->jobs[i]);
}

/* free every weight's and job's device buffer and the backend; with the lock held */
static void shutdown_locked(ork_npu_device *d) {
    for (size_t i = 0; i < d->n_jobs; i++) { /* jobs first: they borrow the weights */
        if (d->jobs[i]->live) ork_npu_job_free(d->dev, &d->jobs[i]->j);
        d->jobs[i]->live = 0;
    }
    d->n_jobs = 0;
    for (size_t i = 0; i < d->n_weights; i++) {
        ork_npu_dweight *w = d->weights[i];
        drop_cached_jobs(d, w); /* the hook's jobs borrow the weight too */
        if (w->live && d->dev) ork_npu_weight_free(d->dev, &w->w);
        w->live = 0;
    }
    d->n_weights = 0;
    if (d->dev) ork_npu_dev_close(d->dev);
    d->dev = NULL;
}

void ork_npu_device_close(ork_npu_device *d) {
    pthread_mutex_lock(&d->lock);
    shutdown_locked(d);
    pthread_mutex_unlock(&d->lock);
}

void ork_npu_device_free(ork_npu_device *d) {
    if (!d) return;
    shutdown_locked(d); /* no other user is left */
    free(d->weights);
    free(d->jobs);
    if (d->fake) d->fk->free(d->fake);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

int ork_npu_device_is_open(ork_npu_device *d) {
    pthread_mutex_lock(&d->lock);
    int open = d->dev != NULL;
    pthread_mutex_unlock(&d->lock);
    return open;
}

uint32_t ork_npu_device_timeout_ms(const ork_npu_device *d) { return d->timeout_ms; }

static ork_status closed(ork_err *err) { return ork_err_set(err, ORK_EINVAL, "the NPU device is closed"); }

ork_status ork_npu_device_info(ork_npu_device *d, ork_npu_dev_info *info, ork_err *err) {
    memset(info, 0, sizeof *info);
    info->backend = "closed";
    pthread_mutex_lock(&d->lock);
    ork_status st = ORK_OK;
    if (d->dev) ork_npu_dev_get_info(d->dev, info);
    else if (!d->fake) st = closed(err); /* closed, and no fake kernel state to report */
    pthread_mutex_unlock(&d->lock);
    return st;
}

int ork_npu_device_fake_report(ork_npu_device *d, ork_npu_fake_report *r) {
    if (!d->fake) return 0;
    pthread_mutex_lock(&d->lock);
    d->fk->get_stats(d->fake, &r->stats);
    snprintf(r->last_error, sizeof r->last_error, "%s", d->fk->last_error(d->fake));
    snprintf(r->trace, sizeof r->trace, "%s", d->fk->trace(d->fake));
    pthread_mutex_unlock(&d->lock);
    return 1;
}

ork_status ork_npu_device_set_faults(ork_npu_device *d, unsigned faults, ork_err *err) {
    if (!d->fake) return ork_err_set(err, ORK_EINVAL, "set_faults needs a device opened on a fake kernel");
    pthread_mutex_lock(&d->lock);
    d->fk->set_faults(d->fake, faults);
    pthread_mutex_unlock(&d->lock);
    return ORK_OK;
}

/* the end of an upload into w (made by new_weight, the lock held): on success w is registered with its
 * device (so a close frees its buffer) and handed out, else freed; unlocks */
static ork_status finish_upload(ork_npu_device *d, ork_npu_dweight *w, ork_status st, ork_npu_dweight **out,
                                ork_err *err) {
    if (st == ORK_OK) {
        w->live = 1;
        w->N = w->w.N;
        w->K = w->w.K;
        w->addr = w->w.bo.dma;
        w->nbytes = w->w.bo.size;
        w->groups = w->w.opts.group ? (w->K + w->w.opts.group - 1) / w->w.opts.group : 1;
        if (list_add((void ***)&d->weights, &d->n_weights, &d->cap_weights, w) < 0) {
            ork_npu_weight_free(d->dev, &w->w);
            st = ork_err_set(err, ORK_ENOMEM, "npu: out of memory");
        }
    }
    pthread_mutex_unlock(&d->lock);
    if (st != ORK_OK) {
        free(w);
        return st;
    }
    *out = w;
    return ORK_OK;
}

static ork_npu_dweight *new_weight(ork_npu_device *d, ork_err *err, ork_status *st) {
    ork_npu_dweight *w = (ork_npu_dweight *)calloc(1, sizeof *w);
    if (!w) {
        *st = ork_err_set(err, ORK_ENOMEM, "npu: out of memory");
        return NULL;
    }
    w->dev = d;
    pthread_mutex_lock(&d->lock);
    if (!d->dev) {
        pthread_mutex_unlock(&d->lock);
        free(w);
        *st = closed(err);
        return NULL;
    }
    return w; /* with the lock held */
}

ork_status ork_npu_device_upload_i8(ork_npu_device *d, const int8_t *B, uint32_t N, uint32_t K,
                                    const ork_npu_plan_opts *opts, ork_npu_dweight **out, ork_err *err) {
    *out = NULL;
    ork_status st;
    ork_npu_dweight *w = new_weight(d, err, &st);
    if (!w) return st;
    st = ork_npu_weight_upload_i8(d->dev, B, N, K, K, opts, &w->w, err);
    return finish_upload(d, w, st, out, err);
}

/* A store's codes as an int8 (N, K) matrix for an int4 upload: the kind's codes must fit int4 (an integer
 * kind of qmax <= 7: w4a4, w4a8). */
static ork_status int4_codes(ork_kind kind, const void *store, uint32_t N, uint32_t K, int8_t **B, ork_err *err) {
    *B = NULL;
    const ork_kind_info *ki = ork_kind_get(kind);
    if (!ki) return ork_err_set(err, ORK_EINVAL, "npu upload: unknown kind %d", (int)kind);
    if (ki->bits != 8 || ki->qmax > 7)
        return ork_err_set(err, ORK_EINVAL, "npu upload: a %s weight cannot run in the int4 mode (its codes are not "
                           "integers in [-8, 7]; upload it at precision int8)", ki->name);
    *B = (int8_t *)malloc((size_t)N * K + 1);
    if (!*B) return ork_err_set(err, ORK_ENOMEM, "npu: out of memory");
    ork_status st = ork_unpack(kind, store, N, K, *B, err);
    if (st != ORK_OK) {
        free(*B);
        *B = NULL;
    }
    return st;
}

ork_status ork_npu_device_upload_store(ork_npu_device *d, ork_kind kind, const void *store, const int8_t lut[16],
                                       uint32_t N, uint32_t K, const ork_npu_plan_opts *opts, ork_npu_dweight **out,
                                       ork_err *err) {
    *out = NULL;
    ork_status st;
    int8_t *B = NULL;
    if (opts && opts->precision == ORK_NPU_PREC_INT4 && (st = int4_codes(kind, store, N, K, &B, err)) != ORK_OK)
        return st;
    ork_npu_dweight *w = new_weight(d, err, &st);
    if (!w) {
        free(B);
        return st;
    }
    w->split = B != NULL;
    st = B ? ork_npu_weight_upload_i8(d->dev, B, N, K, K, opts, &w->w, err)
           : ork_npu_weight_upload_store(d->dev, kind, store, lut, N, K, opts, &w->w, err);
    free(B);
    return finish_upload(d, w, st, out, err);
}

void ork_npu_dweight_release(ork_npu_dweight *w) {
    if (!w) return;
    ork_npu_device *d = w->dev;
    pthread_mutex_lock(&d->lock);
    drop_cached_jobs(d, w); /* before the weight they borrow */
    if (w->live && d->dev) ork_npu_weight_free(d->dev, &w->w);
    list_remove((void **)d->weights, &d->n_weights, w);
    pthread_mutex_unlock(&d->lock);
    free(w);
}

int ork_npu_dweight_on(ork_npu_dweight *w, ork_npu_device *d) {
    if (w->dev != d) return 0;
    pthread_mutex_lock(&d->lock);
    int ok = w->live && d->dev;
    pthread_mutex_unlock(&d->lock);
    return ok;
}

ork_status ork_npu_dweight_hook(ork_npu_dweight *w, ork_int_mm_fn *fn, void **ctx, size_t *N, size_t *K,
                                size_t *group, ork_err *err) {
    *fn = NULL;
    *ctx = NULL;
    *N = *K = *group = 0;
    pthread_mutex_lock(&w->dev->lock);
    const int ok = w->live && w->dev->dev;
    pthread_mutex_unlock(&w->dev->lock);
    if (!ok) return ork_err_set(err, ORK_EINVAL, "the NPU weight's device is closed");
    *fn = ork_npu_dweight_int_mm;
    *ctx = w;
    *N = w->N;
    *K = w->K;
    *group = w->w.opts.group;
    return ORK_OK;
}

void ork_npu_dweight_shape(const ork_npu_dweight *w, uint32_t *N, uint32_t *K) {
    *N = w->N;
    *K = w->K;
}
uint32_t ork_npu_dweight_addr(const ork_npu_dweight *w) { return w->addr; }
uint64_t ork_npu_dweight_nbytes(const ork_npu_dweight *w) { return w->nbytes; }
ork_npu_precision ork_npu_dweight_precision(const ork_npu_dweight *w) { return w->w.opts.precision; }
uint32_t ork_npu_dweight_group(const ork_npu_dweight *w) { return w->w.opts.group; }
uint32_t ork_npu_dweight_groups(const ork_npu_dweight *w) { return w->groups; }

int ork_npu_dweight_job_rows(ork_npu_dweight *w, uint32_t m[ORK_NPU_JOB_CACHE_SLOTS]) {
    int n = 0;
    pthread_mutex_lock(&w->dev->lock);
    for (int i = 0; i < ORK_NPU_JOB_CACHE_SLOTS; i++)
        if (w->jobs[i].M) m[n++] = w->jobs[i].M;
    pthread_mutex_unlock(&w->dev->lock);
    return n;
}

static ork_status run_weight(ork_npu_device *d, ork_npu_dweight *w, const int8_t *A, size_t M, size_t lda, int32_t *C,
                             int cached, ork_err *err);

ork_status ork_npu_device_matmul(ork_npu_device *d, ork_npu_dweight *w, const int8_t *A, uint32_t M, int32_t *C,
                                 ork_err *err) {
    pthread_mutex_lock(&d->lock);
    ork_status st = !d->dev                 ? closed(err)
                    : w->dev != d || !w->live ? ork_err_set(err, ORK_EINVAL, "the weight belongs to another NPU device")
                                            : run_weight(d, w, A, M, (size_t)w->w.K, C, 0, err);
    pthread_mutex_unlock(&d->lock);
    return st;
}

ork_status ork_npu_device_job(ork_npu_device *d, ork_npu_dweight *const *w, uint32_t n, uint32_t M,
                              ork_npu_djob **out, ork_err *err) {
    *out = NULL;
    const ork_npu_weight **ws = (const ork_npu_weight **)malloc((n ? n : 1) * sizeof *ws);
    ork_npu_djob *j = (ork_npu_djob *)calloc(1, sizeof *j);
    if (!ws || !j) {
        free(ws);
        free(j);
        return ork_err_set(err, ORK_ENOMEM, "npu: out of memory");
    }
    j->dev = d;
    pthread_mutex_lock(&d->lock);
    ork_status st = d->dev ? ORK_OK : closed(err);
    for (uint32_t i = 0; st == ORK_OK && i < n; i++) {
        if (w[i]->dev != d || !w[i]->live)
            st = ork_err_set(err, ORK_EINVAL, "weight %u of the job belongs to another NPU device", i);
        else if (w[i]->split)
            st = ork_err_set(err, ORK_EINVAL, "weight %u of the job is an int4 store's (its rows may become two int4 "
                             "digit rows): run it with matmul or as a model linear", i);
        else if (w[i]->groups > 1)
            st = ork_err_set(err, ORK_EINVAL, "weight %u of the job has group-wise partial sums: run it with matmul or "
                             "as a model linear", i);
        else ws[i] = &w[i]->w;
    }
    if (st == ORK_OK) st = ork_npu_job_make(d->dev, ws, n, M, &j->j, err);
    if (st == ORK_OK) {
        if (list_add((void ***)&d->jobs, &d->n_jobs, &d->cap_jobs, j) < 0) {
            ork_npu_job_free(d->dev, &j->j);
            st = ork_err_set(err, ORK_ENOMEM, "npu: out of memory");
        } else {
            j->live = 1;
            j->n = j->j.n;
            j->M = j->j.M;
            j->tasks = j->j.chain.n_tasks;
            j->cmd_bytes = j->j.chain.cmd_bytes;
        }
    }
    pthread_mutex_unlock(&d->lock);
    free(ws);
    if (st != ORK_OK) {
        free(j);
        return st;
    }
    *out = j;
    return ORK_OK;
}

ork_status ork_npu_djob_run(ork_npu_djob *j, const int8_t *const *A, const size_t *lda, int32_t *const *C,
                            ork_err *err) {
    ork_npu_device *d = j->dev;
    pthread_mutex_lock(&d->lock);
    ork_status st = !j->live || !d->dev ? ork_err_set(err, ORK_EINVAL, "the NPU device of the job was closed")
                                        : ork_npu_job_run(d->dev, &j->j, A, lda, C, d->timeout_ms, err);
    pthread_mutex_unlock(&d->lock);
    return st;
}

void ork_npu_djob_release(ork_npu_djob *j) {
    if (!j) return;
    ork_npu_device *d = j->dev;
    pthread_mutex_lock(&d->lock);
    if (j->live && d->dev) ork_npu_job_free(d->dev, &j->j);
    if (j->live) list_remove((void **)d->jobs, &d->n_jobs, j);
    pthread_mutex_unlock(&d->lock);
    free(j);
}

int ork_npu_djob_live(ork_npu_djob *j) {
    pthread_mutex_lock(&j->dev->lock);
    int live = j->live && j->dev->dev;
    pthread_mutex_unlock(&j->dev->lock);
    return live;
}
uint32_t ork_npu_djob_n(const ork_npu_djob *j) { return j->n; }
uint32_t ork_npu_djob_M(const ork_npu_djob *j) { return j->M; }
uint32_t ork_npu_djob_tasks(const ork_npu_djob *j) { return j->tasks; }
uint64_t ork_npu_djob_cmd_bytes(const ork_npu_djob *j) { return j->cmd_bytes; }
/* The cached job of weight w at M rows (made here on first use while a slot is free), or *job = NULL:
 * plan per call. With the device lock held and the device open. */
static ork_status weight_job(ork_npu_device *d, ork_npu_dweight *w, uint32_t M, ork_npu_job **job, ork_err *err) {
    *job = NULL;
    if (M < 1 || M > ORK_NPU_JOB_CACHE_MAX_M) return ORK_OK;
    ork_npu_job *empty = NULL;
    for (int i = 0; i < ORK_NPU_JOB_CACHE_SLOTS; i++) {
        if (w->jobs[i].M == M) {
            *job = &w->jobs[i];
            return ORK_OK;
        }
        if (!w->jobs[i].M && !empty) empty = &w->jobs[i];
    }
    if (!empty) return ORK_OK; /* full: first come keeps the slots */
    const ork_npu_weight *ws = &w->w;
    ork_status st = ork_npu_job_make(d->dev, &ws, 1, M, empty, err); /* a failure leaves the slot empty */
    if (st == ORK_OK) *job = empty;
    return st;
}

ork_status ork_npu_dweight_int_mm(void *ctx, const int8_t *xq, size_t M, size_t ldq, int32_t *acc, ork_err *err) {
    ork_npu_dweight *w = (ork_npu_dweight *)ctx;
    ork_npu_device *d = w->dev;
    pthread_mutex_lock(&d->lock);
    ork_status st = !d->dev || !w->live ? ork_err_set(err, ORK_EINVAL, "the NPU device of a linear layer was closed")
                                        : run_weight(d, w, xq, M, ldq, acc, 1, err);
    pthread_mutex_unlock(&d->lock);
    return st;
}

/* C (M, N) = A (M rows, stride lda) times w, with d's lock held and w live on d: through w's cached job
 * at the call's row count when `cached` (the forward pass's hook) or planned for the call. An int4 weight
 * uploaded from a store (split) takes any int8 code in [-128, 119]: a row whose codes all lie in [-8, 7]
 * is one int4 row, any other row two int4 digit rows h = floor((x + 8) / 16), l = x - 16 h (both in
 * [-8, 7]; quant.h "w4a8"), all in one matmul, and the row's result is its int32 or 16 acc_h + acc_l: the
 * int8 x code product exactly (w4a8 rows, and the int8 prefix rows of a w4a4 linear's activation spec).
 * A code above 119 has no two digits: ORK_EINVAL naming it (actspec.h "digits" stops at 119). A grouped
 * weight's C is (G, M, N), one block of partial sums per group (plan.h opts.group). */
static ork_status run_weight(ork_npu_device *d, ork_npu_dweight *w, const int8_t *A, size_t M, size_t lda, int32_t *C,
                             int cached, ork_err *err) {
    const size_t K = w->K, N = w->N, G = w->groups;
    if (M > ORK_NPU_MAX_TOTAL_M) return ork_err_set(err, ORK_EINVAL, "too many rows for the NPU");
    size_t rows = M, wide = 0; /* rows of the matmul; input rows that need two digit rows */
    size_t *at = NULL; /* input row m -> first its "needs two digit rows" flag, then its first matmul row (its
                          high digits when wide, the low ones at + 1) */
    if (w->split) {
        if (!(at = (size_t *)malloc((M + 1) * sizeof *at))) return ork_err_set(err, ORK_ENOMEM, "npu: out of memory");
        for (size_t m = 0; m < M; m++) {
            int fits = 1;
            for (size_t k = 0; k < K; k++) {
                const int x = A[m * lda + k];
                if (x > ORK_ACT_DIGITS_QMAX) {
                    free(at);
                    return ork_err_set(err, ORK_EINVAL, "npu: activation code %d at (row %zu, k %zu) has no two int4 "
                                       "digits (an int4 weight takes codes in [-128, %d])", x, m, k, ORK_ACT_DIGITS_QMAX);
                }
                fits &= x >= -8 && x <= 7;
            }
            at[m] = !fits;
            wide += !fits;
        }
    }
    rows += wide;
    if (rows > ORK_NPU_MAX_TOTAL_M) {
        free(at);
        return ork_err_set(err, ORK_EINVAL, "too many rows for the NPU");
    }
    int8_t *D = NULL;
    int32_t *T = NULL;
    const int8_t *in = A;
    size_t ld = lda;
    int32_t *out = C;
    if (wide) {
        D = (int8_t *)malloc(rows * K + 1);
        T = (int32_t *)malloc(G * rows * N * sizeof *T + 1);
        if (!D || !T) {
            free(D);
            free(T);
            free(at);
            return ork_err_set(err, ORK_ENOMEM, "npu: out of memory");
        }
        size_t r = 0;
        for (size_t m = 0; m < M; m++) {
            const int8_t *x = A + m * lda;
            const size_t two = at[m];
            at[m] = r;
            if (!two) {
                memcpy(D + r++ * K, x, K);
                continue;
            }
            for (size_t k = 0; k < K; k++) {
                const int v = x[k] + 8, h = (v - (v & 15)) / 16; /* floor(v / 16), v in [-120, 127] */
                D[r * K + k] = (int8_t)h;
                D[(r + 1) * K + k] = (int8_t)(x[k] - 16 * h);
            }
            r += 2;
        }
        at[M] = r;
        in = D;
        ld = K;
        out = T;
    }
    ork_npu_job *job = NULL;
    ork_status st = cached ? weight_job(d, w, (uint32_t)rows, &job, err) : ORK_OK;
    if (st == ORK_OK)
        st = job ? ork_npu_job_run(d->dev, job, &in, &ld, &out, d->timeout_ms, err)
                 : ork_npu_matmul(d->dev, &w->w, in, (uint32_t)rows, ld, out, d->timeout_ms, err);
    if (st == ORK_OK && wide)
        for (size_t g = 0; g < G; g++) /* a grouped weight: (G, rows, N) partial sums -> (G, M, N) */
            for (size_t m = 0; m < M; m++) {
                const int32_t *t = T + (g * rows + at[m]) * N;
                int32_t *c = C + (g * M + m) * N;
                if (at[m + 1] - at[m] == 1) memcpy(c, t, N * sizeof *C);
                else
                    for (size_t n = 0; n < N; n++) c[n] = 16 * t[n] + t[N + n];
            }
    free(D);
    free(T);
    free(at);
    return st;
}
