/* fake_kernel.c - see fake_kernel.h. Test infrastructure: no real device is
 * touched. */
#include "fake_kernel.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../csrc/ork/npu/emu.h"
#include "../../csrc/ork/npu/regcmd.h"
#include "../../csrc/ork/npu/uapi.h"

#define PAGE 4096u
#define MAX_BOS 4096
#define FD_BASE 100
#define TRACE_CAP 8192

typedef struct {
    int live;
    uint32_t handle, flags;
    uint64_t size, dma, obj_addr, offset;
    uint8_t *dev_mem, *cpu_mem; /* equal when coherent */
    int mapped_at_offset;       /* rknpu: MEM_MAP done */
    int mapped;                 /* mmap count */
    int pending;                /* rocket: job writing it not yet waited for */
    int stale;                  /* at submit: CPU view differs from the device view */
} fbo;

struct ork_fake_kernel {
    ork_fake_persona persona;
    unsigned faults;
    ork_npu_sys sys;
    int fd_open[4];
    fbo bos[MAX_BOS];
    uint32_t next_handle;
    int needs_reset;
    uint32_t stale_handle; /* first non-synced buffer the NPU touched in the current submit */
    int64_t clock;
    ork_fake_stats st;
    char last[256];
    char trace[TRACE_CAP];
    size_t trace_len;
};

static void trace(ork_fake_kernel *k, const char *name) {
    size_t n = strlen(name) + 1;
    if (k->trace_len + n + 1 > TRACE_CAP) {
        size_t drop = k->trace_len / 2;
        memmove(k->trace, k->trace + drop, k->trace_len - drop);
        k->trace_len -= drop;
    }
    memcpy(k->trace + k->trace_len, name, n - 1);
    k->trace_len += n - 1;
    k->trace[k->trace_len++] = '\n';
    k->trace[k->trace_len] = 0;
}

static int refuse(ork_fake_kernel *k, int errnum, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->last, sizeof k->last, fmt, ap);
    va_end(ap);
    k->st.refused++;
    return -errnum;
}

static fbo *bo_by_handle(ork_fake_kernel *k, uint32_t h) {
    for (int i = 0; i < MAX_BOS; i++)
        if (k->bos[i].live && k->bos[i].handle == h) return &k->bos[i];
    return NULL;
}
static fbo *bo_by_obj(ork_fake_kernel *k, uint64_t obj) {
    for (int i = 0; i < MAX_BOS; i++)
        if (k->bos[i].live && k->bos[i].obj_addr == obj) return &k->bos[i];
    return NULL;
}
static fbo *bo_free_slot(ork_fake_kernel *k) {
    for (int i = 0; i < MAX_BOS; i++)
        if (!k->bos[i].live) return &k->bos[i];
    return NULL;
}
static int coherent(const ork_fake_kernel *k, const fbo *b) {
    return k->persona == ORK_FAKE_RKNPU && !(b->flags & ORK_RKNPU_MEM_CACHEABLE);
}

/* the NPU's view of memory; a non-coherent buffer whose CPU view differs
 * from the device view is recorded (the CPU wrote it and did not sync) */
static void *dev_map(void *ctx, uint32_t addr, uint64_t len) {
    ork_fake_kernel *k = (ork_fake_kernel *)ctx;
    for (int i = 0; i < MAX_BOS; i++) {
        fbo *b = &k->bos[i];
        if (b->live && addr >= b->dma && (uint64_t)addr - b->dma + len <= b->size) {
            if (b->stale && !k->stale_handle) k->stale_handle = b->handle;
            return b->dev_mem + (addr - b->dma);
        }
    }
    return NULL;
}

static int new_bo(ork_fake_kernel *k, uint64_t size, uint32_t flags, fbo **out) {
    fbo *b = bo_free_slot(k);
    if (!b) return refuse(k, ENOMEM, "too many buffers");
    size = (size + PAGE - 1) & ~(uint64_t)(PAGE - 1);
    /* first fit: rknpu hands out IOVAs downwards from 4 GiB (as captured), rocket upwards from 0 */
    const int down = k->persona == ORK_FAKE_RKNPU;
    uint64_t dma = down ? 0x100000000ull - size : 0;
    for (int moved = 1; moved;) {
        moved = 0;
        for (int i = 0; i < MAX_BOS; i++) {
            const fbo *o = &k->bos[i];
            if (o->live && dma < o->dma + o->size && o->dma < dma + size) {
                if (down && o->dma < size) return refuse(k, ENOMEM, "IOVA space exhausted");
                dma = down ? o->dma - size : o->dma + o->size;
                moved = 1;
            }
        }
    }
    if (down ? dma < 0x10000000ull : dma + size > 0x100000000ull) return refuse(k, ENOMEM, "IOVA space exhausted");
    memset(b, 0, sizeof *b);
    b->dev_mem = (uint8_t *)aligned_alloc(PAGE, size);
    if (!b->dev_mem) return refuse(k, ENOMEM, "out of memory");
    memset(b->dev_mem, 0, size);
    b->flags = flags;
    b->live = 1;
    if (coherent(k, b)) {
        b->cpu_mem = b->dev_mem;
    } else {
        b->cpu_mem = (uint8_t *)aligned_alloc(PAGE, size);
        if (!b->cpu_mem) {
            free(b->dev_mem);
            b->live = 0;
            return refuse(k, ENOMEM, "out of memory");
        }
        memset(b->cpu_mem, 0, size);
    }
    b->handle = k->next_handle++;
    b->size = size;
    b->dma = dma;
    b->obj_addr = 0xffffff8000000000ull + ((uint64_t)b->handle << 16); /* looks like a kernel pointer */
    b->offset = ((uint64_t)b->handle + 0x100000ull) << 12;
    k->st.live_bos++;
    *out = b;
    return 0;
}

static void drop_bo(ork_fake_kernel *k, fbo *b) {
    if (b->cpu_mem != b->dev_mem) free(b->cpu_mem);
    free(b->dev_mem);
    memset(b, 0, sizeof *b);
    k->st.live_bos--;
}

/* ------------------------------------------------------------ rknpu ----- */
static int rknpu_submit(ork_fake_kernel *k, ork_rknpu_submit *s) {
    if (k->needs_reset) return refuse(k, EIO, "the NPU core timed out earlier and was not reset (ACTION RKNPU_ACT_RESET)");
    if (!(s->flags & ORK_RKNPU_JOB_PC)) return refuse(k, EINVAL, "SUBMIT without RKNPU_JOB_PC (non-PC mode is not modelled)");
    if (s->flags & ~(uint32_t)(ORK_RKNPU_JOB_PC | ORK_RKNPU_JOB_PINGPONG))
        return refuse(k, EINVAL, "SUBMIT flags 0x%x: only PC | PINGPONG, blocking, is modelled", s->flags);
    if (s->timeout == 0) return refuse(k, EINVAL, "SUBMIT with timeout 0 ms");
    if (s->fence_fd != -1) return refuse(k, EINVAL, "SUBMIT fence_fd %d without FENCE flags (must be -1)", s->fence_fd);
    if (s->reserved || s->task_counter || s->iommu_domain_id)
        return refuse(k, EINVAL, "SUBMIT reserved / task_counter / iommu_domain_id not 0");
    if (s->core_mask > 7) return refuse(k, EINVAL, "SUBMIT core_mask 0x%x", s->core_mask);
    fbo *tb = bo_by_obj(k, s->task_obj_addr);
    if (!tb || !(tb->flags & ORK_RKNPU_MEM_KERNEL_MAPPING))
        return refuse(k, EFAULT,
                      "task_obj_addr 0x%llx is not the obj_addr of a KERNEL_MAPPING buffer (the real driver would "
                      "dereference it as a kernel pointer)", (unsigned long long)s->task_obj_addr);
    if (s->task_number == 0 || s->task_number > ORK_RKNPU_MAX_TASKS)
        return refuse(k, EINVAL, "SUBMIT task_number %u (1..4095)", s->task_number);
    if (((uint64_t)s->task_start + s->task_number) * sizeof(ork_rknpu_task) > tb->size)
        return refuse(k, EINVAL, "tasks %u..%u lie outside the task buffer", s->task_start, s->task_start + s->task_number);
    if (s->subcore_task[0].task_start != s->task_start || s->subcore_task[0].task_number != s->task_number)
        return refuse(k, EINVAL, "subcore_task[0] = {%u, %u} differs from {task_start %u, task_number %u}",
                      s->subcore_task[0].task_start, s->subcore_task[0].task_number, s->task_start, s->task_number);
    const ork_rknpu_task *tk = (const ork_rknpu_task *)(const void *)tb->dev_mem + s->task_start;
    uint32_t *visited = (uint32_t *)calloc(s->task_number, sizeof(uint32_t));
    if (!visited) return refuse(k, ENOMEM, "out of memory");
    for (uint32_t i = 0; i < s->task_number; i++) {
        ork_rknpu_task t;
        memcpy(&t, tk + i, sizeof t);
        const char *bad = t.flags ? "flags" : t.enable_mask != 0xd ? "enable_mask (0xd modelled)"
                        : t.int_mask == 0 ? "int_mask" : t.regcfg_amount == 0 ? "regcfg_amount"
                        : t.regcfg_offset ? "regcfg_offset" : (t.regcmd_addr & 0xf) || t.regcmd_addr >> 32 ? "regcmd_addr" : NULL;
        if (bad) {
            free(visited);
            return refuse(k, EINVAL, "task %u: bad %s", s->task_start + i, bad);
        }
        if (!dev_map(k, (uint32_t)t.regcmd_addr, ((uint64_t)t.regcfg_amount + ORK_RKNPU_PC_DATA_EXTRA_AMOUNT) * 8)) {
            free(visited);
            return refuse(k, EFAULT, "task %u: regcmd 0x%llx + %u qwords is not inside a buffer", s->task_start + i,
                          (unsigned long long)t.regcmd_addr, t.regcfg_amount + 4);
        }
    }
    k->st.submits++;
    if (k->faults & ORK_FAKE_HANG) {
        free(visited);
        k->needs_reset = 1;
        return refuse(k, ETIMEDOUT, "job did not complete within %u ms (injected hang)", s->timeout);
    }
    if (k->faults & ORK_FAKE_DROP) { /* the job is lost, the ioctl still succeeds */
        free(visited);
        return 0;
    }
    ork_rknpu_task first;
    memcpy(&first, tk, sizeof first);
    ork_npu_mem mem = {k, dev_map};
    ork_err e;
    e.msg[0] = 0;
    k->stale_handle = 0;
    for (int i = 0; i < MAX_BOS; i++) {
        fbo *b = &k->bos[i];
        b->stale = b->live && b->cpu_mem != b->dev_mem && memcmp(b->cpu_mem, b->dev_mem, b->size) != 0;
    }
    ork_status st = ork_npu_emu_run(&mem, (uint32_t)first.regcmd_addr, ork_npu_pc_amount(first.regcfg_amount),
                                    s->task_number, visited, NULL, &e);
    if (k->stale_handle) {
        free(visited);
        return refuse(k, EINVAL, "the NPU used cacheable buffer %u whose CPU writes were not synced (MEM_SYNC TO_DEVICE)",
                      k->stale_handle);
    }
    if (st) {
        free(visited);
        return refuse(k, EPROTO, "%s", e.msg);
    }
    for (uint32_t i = 0; i < s->task_number; i++) {
        ork_rknpu_task t;
        memcpy(&t, tk + i, sizeof t);
        if (visited[i] != (uint32_t)t.regcmd_addr) {
            uint32_t v = visited[i];
            free(visited);
            return refuse(k, EPROTO, "the PC chain ran task %u at 0x%08x but task record %u says 0x%08x", i, v,
                          s->task_start + i, (uint32_t)t.regcmd_addr);
        }
        t.int_status = t.int_mask & 0x100u;
        memcpy((void *)(tk + i), &t, sizeof t);
    }
    free(visited);
    k->st.tasks += s->task_number;
    s->hw_elapse_time = 1;
    return 0;
}

static int rknpu_ioctl(ork_fake_kernel *k, unsigned long req, void *arg) {
    switch (req) {
    case ORK_RKNPU_IOCTL_ACTION: {
        ork_rknpu_action *a = (ork_rknpu_action *)arg;
        trace(k, "RKNPU_ACTION");
        if (a->flags > 25) return refuse(k, EINVAL, "ACTION %u is unknown", a->flags);
        if (a->flags == ORK_RKNPU_ACT_RESET) k->needs_reset = 0;
        if (a->flags == ORK_RKNPU_GET_DRV_VERSION) a->value = 0x00090008; /* 0.9.8 */
        return 0;
    }
    case ORK_RKNPU_IOCTL_MEM_CREATE: {
        ork_rknpu_mem_create *c = (ork_rknpu_mem_create *)arg;
        trace(k, "RKNPU_MEM_CREATE");
        if (c->flags & ~ORK_RKNPU_MEM_FLAGS_ALL) return refuse(k, EINVAL, "MEM_CREATE flags 0x%x unknown", c->flags);
        if (c->flags & (ORK_RKNPU_MEM_SECURE | ORK_RKNPU_MEM_TRY_ALLOC_SRAM | ORK_RKNPU_MEM_TRY_ALLOC_NBUF))
            return refuse(k, EINVAL, "MEM_CREATE flags 0x%x: secure / SRAM / NBUF buffers are not modelled", c->flags);
        if (c->size == 0 || c->size > 0x40000000ull) return refuse(k, EINVAL, "MEM_CREATE size %llu", (unsigned long long)c->size);
        if (c->handle || c->sram_size || c->iommu_domain_id)
            return refuse(k, EINVAL, "MEM_CREATE: handle, sram_size and iommu_domain_id must be 0 on input");
        fbo *b;
        int rc = new_bo(k, c->size, c->flags, &b);
        if (rc) return rc;
        c->handle = b->handle;
        c->obj_addr = b->obj_addr;
        c->dma_addr = b->dma;
        return 0;
    }
    case ORK_RKNPU_IOCTL_MEM_MAP: {
        ork_rknpu_mem_map *m = (ork_rknpu_mem_map *)arg;
        trace(k, "RKNPU_MEM_MAP");
        if (m->reserved) return refuse(k, EINVAL, "MEM_MAP reserved field is not 0");
        fbo *b = bo_by_handle(k, m->handle);
        if (!b) return refuse(k, ENOENT, "MEM_MAP of unknown handle %u", m->handle);
        b->mapped_at_offset = 1;
        m->offset = b->offset;
        return 0;
    }
    case ORK_RKNPU_IOCTL_MEM_DESTROY: {
        ork_rknpu_mem_destroy *d = (ork_rknpu_mem_destroy *)arg;
        trace(k, "RKNPU_MEM_DESTROY");
        if (d->reserved) return refuse(k, EINVAL, "MEM_DESTROY reserved field is not 0");
        fbo *b = bo_by_handle(k, d->handle);
        if (!b || b->obj_addr != d->obj_addr)
            return refuse(k, ENOENT, "MEM_DESTROY of handle %u with obj_addr 0x%llx: no such buffer", d->handle,
                          (unsigned long long)d->obj_addr);
        if (b->mapped) return refuse(k, EBUSY, "MEM_DESTROY of handle %u while it is still mmapped", d->handle);
        drop_bo(k, b);
        return 0;
    }
    case ORK_RKNPU_IOCTL_MEM_SYNC: {
        ork_rknpu_mem_sync *y = (ork_rknpu_mem_sync *)arg;
        trace(k, y->flags == ORK_RKNPU_MEM_SYNC_TO_DEVICE ? "RKNPU_MEM_SYNC(TO_DEVICE)" : "RKNPU_MEM_SYNC(FROM_DEVICE)");
        if (y->reserved) return refuse(k, EINVAL, "MEM_SYNC reserved field is not 0");
        if (y->flags != ORK_RKNPU_MEM_SYNC_TO_DEVICE && y->flags != ORK_RKNPU_MEM_SYNC_FROM_DEVICE)
            return refuse(k, EINVAL, "MEM_SYNC flags %u", y->flags);
        fbo *b = bo_by_obj(k, y->obj_addr);
        if (!b) return refuse(k, ENOENT, "MEM_SYNC of unknown obj_addr 0x%llx", (unsigned long long)y->obj_addr);
        if (y->offset > b->size || y->size > b->size - y->offset) return refuse(k, EINVAL, "MEM_SYNC range outside the buffer");
        k->st.syncs++;
        if (b->cpu_mem != b->dev_mem) {
            if (y->flags == ORK_RKNPU_MEM_SYNC_TO_DEVICE) memcpy(b->dev_mem + y->offset, b->cpu_mem + y->offset, y->size);
            else memcpy(b->cpu_mem + y->offset, b->dev_mem + y->offset, y->size);
        }
        return 0;
    }
    case ORK_RKNPU_IOCTL_SUBMIT:
        trace(k, "RKNPU_SUBMIT");
        return rknpu_submit(k, (ork_rknpu_submit *)arg);
    default:
        trace(k, "unknown-ioctl");
        return refuse(k, ENOTTY, "ioctl 0x%08lx is not an rknpu ioctl", req);
    }
}

/* ------------------------------------------------------------ rocket ---- */
static int rocket_submit(ork_fake_kernel *k, const ork_rocket_submit *s) {
    if (s->reserved) return refuse(k, EINVAL, "ROCKET_SUBMIT reserved is not 0");
    if (s->job_struct_size < sizeof(ork_rocket_job)) return refuse(k, EINVAL, "job_struct_size %u < 40", s->job_struct_size);
    if (s->job_count == 0 || !s->jobs) return refuse(k, EINVAL, "ROCKET_SUBMIT without jobs");
    for (uint32_t j = 0; j < s->job_count; j++) {
        const ork_rocket_job *job = (const ork_rocket_job *)(uintptr_t)(s->jobs + (uint64_t)j * s->job_struct_size);
        if (job->task_struct_size < sizeof(ork_rocket_task))
            return refuse(k, EINVAL, "job %u: task_struct_size %u < 8", j, job->task_struct_size);
        if (job->task_count == 0 || !job->tasks) return refuse(k, EINVAL, "job %u: task_count 0", j);
        const uint32_t *ih = (const uint32_t *)(uintptr_t)job->in_bo_handles;
        const uint32_t *oh = (const uint32_t *)(uintptr_t)job->out_bo_handles;
        for (uint32_t i = 0; i < job->in_bo_handle_count; i++) {
            fbo *b = bo_by_handle(k, ih[i]);
            if (!b) return refuse(k, ENOENT, "job %u: unknown input BO handle %u", j, ih[i]);
            if (memcmp(b->cpu_mem, b->dev_mem, b->size))
                return refuse(k, EINVAL, "job %u: input BO %u was written by the CPU but not FINI_BO'd before SUBMIT", j, ih[i]);
        }
        for (uint32_t i = 0; i < job->out_bo_handle_count; i++)
            if (!bo_by_handle(k, oh[i])) return refuse(k, ENOENT, "job %u: unknown output BO handle %u", j, oh[i]);
        for (uint32_t t = 0; t < job->task_count; t++) {
            const ork_rocket_task *tk = (const ork_rocket_task *)(uintptr_t)(job->tasks + (uint64_t)t * job->task_struct_size);
            if (tk->regcmd_count == 0) return refuse(k, EINVAL, "job %u task %u: regcmd_count 0", j, t);
        }
        k->st.submits++;
        if (k->faults & ORK_FAKE_HANG) {
            for (uint32_t i = 0; i < job->out_bo_handle_count; i++) bo_by_handle(k, oh[i])->pending = 1;
            continue; /* never completes; the real kernel resets the core after 500 ms */
        }
        if (k->faults & ORK_FAKE_DROP) continue; /* rocket ignores per-job errors: SUBMIT returns 0 */
        for (uint32_t t = 0; t < job->task_count; t++) {
            const ork_rocket_task *tk = (const ork_rocket_task *)(uintptr_t)(job->tasks + (uint64_t)t * job->task_struct_size);
            ork_npu_mem mem = {k, dev_map};
            ork_err e;
            e.msg[0] = 0;
            /* the kernel programs REGISTER_AMOUNTS = (regcmd_count + 1) / 2 - 1 and one task per run */
            uint32_t amount = (tk->regcmd_count + 1) / 2 - 1;
            if (amount == 0) return refuse(k, EINVAL, "job %u task %u: regcmd_count %u is too small", j, t, tk->regcmd_count);
            if (ork_npu_emu_run(&mem, tk->regcmd, amount, 1, NULL, NULL, &e))
                return refuse(k, EPROTO, "job %u task %u (the real kernel ignores this and returns 0): %s", j, t, e.msg);
            k->st.tasks++;
        }
        for (uint32_t i = 0; i < job->out_bo_handle_count; i++) bo_by_handle(k, oh[i])->pending = 1;
    }
    return 0;
}

static int rocket_ioctl(ork_fake_kernel *k, unsigned long req, void *arg) {
    switch (req) {
    case ORK_ROCKET_IOCTL_CREATE_BO: {
        ork_rocket_create_bo *c = (ork_rocket_create_bo *)arg;
        trace(k, "ROCKET_CREATE_BO");
        if (c->size == 0) return refuse(k, EINVAL, "CREATE_BO size 0");
        fbo *b;
        int rc = new_bo(k, c->size, 0, &b);
        if (rc) return rc;
        c->handle = b->handle;
        c->dma_address = b->dma;
        c->offset = b->offset;
        b->mapped_at_offset = 1;
        return 0;
    }
    case ORK_DRM_IOCTL_GEM_CLOSE: {
        ork_drm_gem_close *g = (ork_drm_gem_close *)arg;
        trace(k, "GEM_CLOSE");
        if (g->pad) return refuse(k, EINVAL, "GEM_CLOSE pad is not 0");
        fbo *b = bo_by_handle(k, g->handle);
        if (!b) return refuse(k, ENOENT, "GEM_CLOSE of unknown handle %u", g->handle);
        if (b->mapped) return refuse(k, EBUSY, "GEM_CLOSE of handle %u while it is still mmapped", g->handle);
        drop_bo(k, b);
        return 0;
    }
    case ORK_ROCKET_IOCTL_FINI_BO: {
        ork_rocket_fini_bo *f = (ork_rocket_fini_bo *)arg;
        trace(k, "ROCKET_FINI_BO");
        if (f->reserved) return refuse(k, EINVAL, "FINI_BO reserved is not 0");
        fbo *b = bo_by_handle(k, f->handle);
        if (!b) return refuse(k, ENOENT, "FINI_BO of unknown handle %u", f->handle);
        memcpy(b->dev_mem, b->cpu_mem, b->size);
        k->st.syncs++;
        return 0;
    }
    case ORK_ROCKET_IOCTL_PREP_BO: {
        ork_rocket_prep_bo *p = (ork_rocket_prep_bo *)arg;
        trace(k, "ROCKET_PREP_BO");
        if (p->reserved) return refuse(k, EINVAL, "PREP_BO reserved is not 0");
        fbo *b = bo_by_handle(k, p->handle);
        if (!b) return refuse(k, ENOENT, "PREP_BO of unknown handle %u", p->handle);
        k->clock += 1000; /* time passes */
        if (b->pending && p->timeout_ns < k->clock)
            return refuse(k, EBUSY, "PREP_BO deadline %lld ns is in the past (now %lld): timeout_ns is an absolute "
                                    "CLOCK_MONOTONIC time", (long long)p->timeout_ns, (long long)k->clock);
        if (b->pending && (k->faults & ORK_FAKE_HANG)) {
            k->clock = p->timeout_ns;
            return refuse(k, ETIMEDOUT, "the job writing BO %u never completed (injected hang)", p->handle);
        }
        b->pending = 0;
        memcpy(b->cpu_mem, b->dev_mem, b->size);
        k->st.syncs++;
        return 0;
    }
    case ORK_ROCKET_IOCTL_SUBMIT:
        trace(k, "ROCKET_SUBMIT");
        return rocket_submit(k, (const ork_rocket_submit *)arg);
    default:
        trace(k, "unknown-ioctl");
        return refuse(k, ENOTTY, "ioctl 0x%08lx is not a rocket ioctl", req);
    }
}

/* ------------------------------------------------------------ sys table - */
static const char *node_names[2][2] = {{"/dev/dri/card0", "/dev/dri/renderD128"}, {"/dev/dri/card0", "/dev/accel/accel0"}};

static int f_open(void *ctx, const char *path) {
    ork_fake_kernel *k = (ork_fake_kernel *)ctx;
    trace(k, "open");
    for (int i = 0; i < 2; i++)
        if (strcmp(path, node_names[k->persona][i]) == 0) {
            k->fd_open[i] = 1;
            return FD_BASE + i;
        }
    return -ENOENT;
}
static int f_close(void *ctx, int fd) {
    ork_fake_kernel *k = (ork_fake_kernel *)ctx;
    trace(k, "close");
    if (fd < FD_BASE || fd >= FD_BASE + 2 || !k->fd_open[fd - FD_BASE]) return refuse(k, EBADF, "close of fd %d", fd);
    k->fd_open[fd - FD_BASE] = 0;
    return 0;
}
static int f_ioctl(void *ctx, int fd, unsigned long req, void *arg) {
    ork_fake_kernel *k = (ork_fake_kernel *)ctx;
    k->st.ioctls++;
    if (fd != FD_BASE + 1 || !k->fd_open[1]) return refuse(k, EBADF, "ioctl on fd %d, which is not the open NPU node", fd);
    if (!arg) return refuse(k, EFAULT, "ioctl with a NULL argument");
    return k->persona == ORK_FAKE_RKNPU ? rknpu_ioctl(k, req, arg) : rocket_ioctl(k, req, arg);
}
static void *f_mmap(void *ctx, size_t len, int fd, uint64_t offset, int *err_no) {
    ork_fake_kernel *k = (ork_fake_kernel *)ctx;
    trace(k, "mmap");
    if (fd != FD_BASE + 1 || !k->fd_open[1]) {
        *err_no = -refuse(k, EBADF, "mmap on fd %d", fd);
        return NULL;
    }
    for (int i = 0; i < MAX_BOS; i++) {
        fbo *b = &k->bos[i];
        if (b->live && b->offset == offset) {
            if (!b->mapped_at_offset) {
                *err_no = -refuse(k, EINVAL, "mmap of buffer %u before MEM_MAP", b->handle);
                return NULL;
            }
            if (len == 0 || len > b->size) {
                *err_no = -refuse(k, EINVAL, "mmap of %zu bytes of a %llu-byte buffer", len, (unsigned long long)b->size);
                return NULL;
            }
            b->mapped++;
            k->st.mapped++;
            return b->cpu_mem;
        }
    }
    *err_no = -refuse(k, EINVAL, "mmap at offset 0x%llx: no buffer was mapped there", (unsigned long long)offset);
    return NULL;
}
static int f_munmap(void *ctx, void *p, size_t len) {
    ork_fake_kernel *k = (ork_fake_kernel *)ctx;
    trace(k, "munmap");
    for (int i = 0; i < MAX_BOS; i++) {
        fbo *b = &k->bos[i];
        if (b->live && b->cpu_mem == p && b->mapped) {
            b->mapped--;
            k->st.mapped--;
            return 0;
        }
    }
    (void)len;
    return refuse(k, EINVAL, "munmap of an address that is not mapped");
}
static int f_driver_name(void *ctx, int fd, char *buf, size_t len) {
    ork_fake_kernel *k = (ork_fake_kernel *)ctx;
    trace(k, "DRM_IOCTL_VERSION");
    if (fd < FD_BASE || fd >= FD_BASE + 2 || !k->fd_open[fd - FD_BASE]) return -EBADF;
    const char *name = fd == FD_BASE ? "simpledrm" : k->persona == ORK_FAKE_RKNPU ? "rknpu" : "rocket";
    snprintf(buf, len, "%s", name);
    return 0;
}
static int f_list(void *ctx, const char *pattern, char (*paths)[64], int max) {
    ork_fake_kernel *k = (ork_fake_kernel *)ctx;
    int n = 0;
    for (int i = 0; i < 2 && n < max; i++) {
        const char *p = node_names[k->persona][i];
        if (i == 1 && (k->faults & ORK_FAKE_NO_DEVICE)) continue;
        size_t pre = strcspn(pattern, "*");
        if (strncmp(p, pattern, pre) == 0) snprintf(paths[n++], 64, "%s", p);
    }
    return n;
}
static int64_t f_now(void *ctx) {
    ork_fake_kernel *k = (ork_fake_kernel *)ctx;
    return k->clock;
}
static const char *f_last(void *ctx) { return ((ork_fake_kernel *)ctx)->last; }

ork_status ork_fake_kernel_for(ork_npu_backend_kind backend, ork_fake_kernel **out, ork_err *err) {
    if (backend == ORK_NPU_BE_RKNPU) return ork_fake_kernel_new(ORK_FAKE_RKNPU, out, err);
    if (backend == ORK_NPU_BE_ROCKET) return ork_fake_kernel_new(ORK_FAKE_ROCKET, out, err);
    /* the backend's name spelled here: the test library links only the emulator, regcmd and status of the core */
    return ork_err_set(err, ORK_EINVAL, "npu: the %s backend has no kernel driver to fake",
                       backend == ORK_NPU_BE_EMU ? "emu" : "unknown");
}

ork_status ork_fake_kernel_new(ork_fake_persona persona, ork_fake_kernel **out, ork_err *err) {
    if (!out || (persona != ORK_FAKE_RKNPU && persona != ORK_FAKE_ROCKET))
        return ork_err_set(err, ORK_EINVAL, "fake kernel: bad arguments");
    ork_fake_kernel *k = (ork_fake_kernel *)calloc(1, sizeof *k);
    if (!k) return ork_err_set(err, ORK_ENOMEM, "fake kernel: out of memory");
    k->persona = persona;
    k->next_handle = 1;
    k->clock = 1000000000000000ll;
    k->sys = (ork_npu_sys){k, persona == ORK_FAKE_RKNPU ? "fake-rknpu" : "fake-rocket", f_open, f_close, f_ioctl, f_mmap,
                           f_munmap, f_driver_name, f_list, f_now, f_last};
    *out = k;
    return ORK_OK;
}

void ork_fake_kernel_free(ork_fake_kernel *k) {
    if (!k) return;
    for (int i = 0; i < MAX_BOS; i++)
        if (k->bos[i].live) drop_bo(k, &k->bos[i]);
    free(k);
}
const ork_npu_sys *ork_fake_kernel_sys(ork_fake_kernel *k) { return &k->sys; }
void ork_fake_kernel_set_faults(ork_fake_kernel *k, unsigned faults) { k->faults = faults; }
void ork_fake_kernel_get_stats(const ork_fake_kernel *k, ork_fake_stats *s) { *s = k->st; }
const char *ork_fake_kernel_last_error(const ork_fake_kernel *k) { return k->last; }
const char *ork_fake_kernel_trace(const ork_fake_kernel *k) { return k->trace; }

/* ------------------------------------------- the table the core is handed --
 * The one symbol the test library exports (device.h "test kernels"): the
 * library is built with hidden visibility, so its own copies of the emulator
 * and the status helpers never meet the extension's. */
static ork_status api_open(ork_npu_backend_kind backend, void **fake, const ork_npu_sys **sys, ork_err *err) {
    ork_fake_kernel *k = NULL;
    ork_status st = ork_fake_kernel_for(backend, &k, err);
    if (st != ORK_OK) return st;
    *fake = k;
    *sys = ork_fake_kernel_sys(k);
    return ORK_OK;
}
static void api_free(void *fake) { ork_fake_kernel_free((ork_fake_kernel *)fake); }
static void api_set_faults(void *fake, unsigned faults) { ork_fake_kernel_set_faults((ork_fake_kernel *)fake, faults); }
static void api_get_stats(const void *fake, ork_npu_fake_stats *s) {
    ork_fake_stats f;
    ork_fake_kernel_get_stats((const ork_fake_kernel *)fake, &f);
    s->ioctls = f.ioctls;
    s->submits = f.submits;
    s->tasks = f.tasks;
    s->refused = f.refused;
    s->live_bos = f.live_bos;
    s->mapped = f.mapped;
    s->syncs = f.syncs;
}
static const char *api_last_error(const void *fake) { return ork_fake_kernel_last_error((const ork_fake_kernel *)fake); }
static const char *api_trace(const void *fake) { return ork_fake_kernel_trace((const ork_fake_kernel *)fake); }

static const ork_npu_test_kernel api = {ORK_NPU_TEST_KERNEL_ABI, sizeof(ork_npu_test_kernel), api_open, api_free,
                                        api_set_faults, api_get_stats, api_last_error, api_trace};

ORK_FAKE_EXPORT const ork_npu_test_kernel *ork_npu_fake_kernel_table(void) { return &api; }
