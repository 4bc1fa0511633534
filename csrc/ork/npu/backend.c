/* backend.c - see backend.h. */
#include "backend.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu.h"
#include "regcmd.h"
#include "uapi.h"

#define PAGE 4096u
/* no task can produce them: |acc| <= 8192 * 128 * 128 = 2^27 within an int8 task, an int4 task's int16
 * partials lie in [-26880, 30720] (K tiles of at most 480 codes, plan.h) */
#define OUT_SENTINEL ((int32_t)0x7ffffff5)
#define OUT_SENTINEL16 ((int16_t)0x7fff)

/* the sentinel fill of one matmul's output region, and whether a task's block still holds it */
static void fill_sentinels(const ork_npu_plan *p, uint8_t *o) {
    for (uint64_t i = 0; p->out_esz == 4 && i < p->out_bytes / 4; i++) ((int32_t *)(void *)o)[i] = OUT_SENTINEL;
    for (uint64_t i = 0; p->out_esz == 2 && i < p->out_bytes / 2; i++) ((int16_t *)(void *)o)[i] = OUT_SENTINEL16;
}
static int unwritten(const ork_npu_plan *p, const ork_npu_task_desc *d, const uint8_t *o) {
    const uint64_t n = (uint64_t)d->Mp * d->Nt;
    for (uint64_t j = 0; j < n; j++)
        if (p->out_esz == 4 ? ((const int32_t *)(const void *)(o + d->out_off))[j] == OUT_SENTINEL
                            : ((const int16_t *)(const void *)(o + d->out_off))[j] == OUT_SENTINEL16)
            return 1;
    return 0;
}

typedef struct {
    uint32_t dma;
    uint64_t size;
    uint8_t *cpu;
} live_bo;

struct ork_npu_dev {
    ork_npu_backend_kind kind;
    const ork_npu_sys *sys;
    int fd;
    char node[64];
    /* emu */
    uint32_t emu_base;
    uint32_t next_handle;
    live_bo *live;
    size_t n_live, cap_live;
    /* scratch buffers reused across matmuls */
    ork_npu_bo cmd, in, out, tasks;
    int have_cmd, have_in, have_out, have_tasks;
    uint64_t submits, n_tasks, to_dev, from_dev, plans;
};

static uint64_t page_round(uint64_t x) { return (x + PAGE - 1) & ~(uint64_t)(PAGE - 1); }

const char *const ork_npu_backend_names[ORK_NPU_BE_COUNT] = {"emu", "rknpu", "rocket"};

int ork_npu_backend_find(const char *name, ork_npu_backend_kind *kind) {
    for (int i = 0; name && i < ORK_NPU_BE_COUNT; i++)
        if (strcmp(name, ork_npu_backend_names[i]) == 0) {
            *kind = (ork_npu_backend_kind)i;
            return 0;
        }
    return -1;
}

static const char *kind_name(ork_npu_backend_kind k) { return ork_npu_backend_names[k]; }

static ork_status sys_fail(const ork_npu_dev *dev, const char *call, int rc, ork_err *err) {
    int e = rc < 0 ? -rc : rc;
    const char *detail = dev->sys && dev->sys->last_error ? dev->sys->last_error(dev->sys->ctx) : NULL;
    if (detail && detail[0]) return ork_err_set(err, ORK_ENPUCMD, "npu: %s refused: %s", call, detail);
    if (e == ETIMEDOUT || e == ETIME)
        return ork_err_set(err, ORK_ETIMEDOUT, "npu: %s timed out (%s)", call, strerror(e));
    return ork_err_set(err, ORK_ENPU, "npu: %s failed: %s (errno %d)", call, strerror(e), e);
}

/* ------------------------------------------------------------ discovery -- */
static ork_status discover(ork_npu_dev *dev, ork_err *err) {
    static const char *const rknpu_globs[] = {"/dev/dri/renderD*", "/dev/dri/card*", NULL};
    static const char *const rocket_globs[] = {"/dev/accel/accel*", NULL};
    const char *const *globs = dev->kind == ORK_NPU_BE_RKNPU ? rknpu_globs : rocket_globs;
    const char *want = kind_name(dev->kind);
    char seen[256] = "";
    size_t seen_len = 0;
    for (size_t g = 0; globs[g]; g++) {
        char paths[32][64];
        int n = dev->sys->list_nodes(dev->sys->ctx, globs[g], paths, 32);
        for (int i = 0; i < n; i++) {
            int fd = dev->sys->open(dev->sys->ctx, paths[i]);
            if (fd < 0) {
                seen_len += (size_t)snprintf(seen + seen_len, sizeof seen - seen_len < 1 ? 1 : sizeof seen - seen_len,
                                             "%s%s (open: %s)", seen_len ? ", " : "", paths[i], strerror(-fd));
                if (seen_len >= sizeof seen) seen_len = sizeof seen - 1;
                continue;
            }
            char name[64] = "";
            int rc = dev->sys->driver_name(dev->sys->ctx, fd, name, sizeof name);
            if (rc == 0 && strcmp(name, want) == 0) {
                dev->fd = fd;
                memcpy(dev->node, paths[i], sizeof dev->node);
                dev->node[sizeof dev->node - 1] = 0;
                return ORK_OK;
            }
            seen_len += (size_t)snprintf(seen + seen_len, sizeof seen - seen_len < 1 ? 1 : sizeof seen - seen_len, "%s%s (%s)",
                                         seen_len ? ", " : "", paths[i], rc == 0 ? name : "no DRM version");
            if (seen_len >= sizeof seen) seen_len = sizeof seen - 1;
            dev->sys->close(dev->sys->ctx, fd);
        }
    }
    return ork_err_set(err, ORK_ENPUUNAVAIL, "npu: no device with driver \"%s\" (%s: %s)", want,
                       dev->kind == ORK_NPU_BE_RKNPU ? "/dev/dri" : "/dev/accel",
                       seen_len ? seen : "no device nodes");
}

ork_status ork_npu_dev_open(ork_npu_backend_kind kind, const ork_npu_sys *sys, uint32_t emu_base, ork_npu_dev **out,
                            ork_err *err) {
    if (!out) return ork_err_set(err, ORK_EINVAL, "npu open: NULL output");
    *out = NULL;
    if ((int)kind < 0 || (int)kind >= ORK_NPU_BE_COUNT)
        return ork_err_set(err, ORK_EINVAL, "npu open: unknown backend");
    if (kind == ORK_NPU_BE_EMU && (emu_base % PAGE))
        return ork_err_set(err, ORK_EINVAL, "npu open: emu base address 0x%08x is not page aligned", emu_base);
    ork_npu_dev *dev = (ork_npu_dev *)calloc(1, sizeof *dev);
    if (!dev) return ork_err_set(err, ORK_ENOMEM, "npu open: out of memory");
    dev->kind = kind;
    dev->fd = -1;
    dev->next_handle = 1;
    if (kind == ORK_NPU_BE_EMU) {
        dev->emu_base = emu_base ? emu_base : PAGE;
        *out = dev;
        return ORK_OK;
    }
    if (!sys) {
        const char *why = NULL;
        sys = ork_npu_sys_linux(&why);
        if (!sys) {
            free(dev);
            return ork_err_set(err, ORK_ENPUUNAVAIL, "npu: backend %s unavailable: %s", kind_name(kind), why);
        }
    }
    dev->sys = sys;
    ork_status st = discover(dev, err);
    if (st) {
        free(dev);
        return st;
    }
    /* no ACTION(RESET) here: probing or opening must not kill another user's job;
     * the core is reset only after one of our submits failed */
    *out = dev;
    return ORK_OK;
}

void ork_npu_dev_close(ork_npu_dev *dev) {
    if (!dev) return;
    if (dev->have_cmd) ork_npu_bo_free(dev, &dev->cmd);
    if (dev->have_in) ork_npu_bo_free(dev, &dev->in);
    if (dev->have_out) ork_npu_bo_free(dev, &dev->out);
    if (dev->have_tasks) ork_npu_bo_free(dev, &dev->tasks);
    if (dev->fd >= 0) dev->sys->close(dev->sys->ctx, dev->fd);
    free(dev->live);
    free(dev);
}

void ork_npu_dev_get_info(const ork_npu_dev *dev, ork_npu_dev_info *info) {
    memset(info, 0, sizeof *info);
    info->backend = kind_name(dev->kind);
    snprintf(info->node, sizeof info->node, "%s", dev->node);
    snprintf(info->sys, sizeof info->sys, "%s", dev->sys ? dev->sys->name : "");
    info->submits = dev->submits;
    info->tasks = dev->n_tasks;
    info->bytes_to_device = dev->to_dev;
    info->bytes_from_device = dev->from_dev;
    info->plans = dev->plans;
}

int ork_npu_probe(ork_npu_backend_kind kind, char *why, size_t len) {
    if (kind == ORK_NPU_BE_EMU) return 0;
    ork_npu_dev *dev = NULL;
    ork_err e;
    e.msg[0] = 0;
    if (ork_npu_dev_open(kind, NULL, 0, &dev, &e) == ORK_OK) {
        ork_npu_dev_close(dev);
        return 0;
    }
    snprintf(why, len, "%s", e.msg);
    return 1;
}

/* ------------------------------------------------------------ buffers --- */
static void *emu_map(void *ctx, uint32_t addr, uint64_t len) {
    ork_npu_dev *dev = (ork_npu_dev *)ctx;
    for (size_t i = 0; i < dev->n_live; i++) {
        live_bo *b = &dev->live[i];
        if (addr >= b->dma && (uint64_t)addr - b->dma + len <= b->size) return b->cpu + (addr - b->dma);
    }
    return NULL;
}

ork_status ork_npu_bo_alloc(ork_npu_dev *dev, uint64_t size, ork_npu_bo_usage usage, ork_npu_bo *bo, ork_err *err) {
    if (!dev || !bo) return ork_err_set(err, ORK_EINVAL, "npu bo_alloc: NULL argument");
    memset(bo, 0, sizeof *bo);
    if (size == 0) size = 1;
    size = page_round(size);
    if (size > 0xffffffffull) return ork_err_set(err, ORK_EINVAL, "npu bo_alloc: %llu bytes exceeds 4 GiB", (unsigned long long)size);
    bo->size = size;
    bo->usage = usage;
    if (dev->kind == ORK_NPU_BE_EMU) {
        /* first fit over the live buffers (freed ranges are reused) */
        uint64_t cand = dev->emu_base;
        for (int moved = 1; moved;) {
            moved = 0;
            for (size_t i = 0; i < dev->n_live; i++)
                if (cand < (uint64_t)dev->live[i].dma + dev->live[i].size && dev->live[i].dma < cand + size) {
                    cand = (uint64_t)dev->live[i].dma + dev->live[i].size;
                    moved = 1;
                }
        }
        if (cand + size > ((uint64_t)1 << 32))
            return ork_err_set(err, ORK_ENOMEM, "npu emu: the 32-bit NPU address space is exhausted (%llu bytes asked)",
                               (unsigned long long)size);
        if (dev->n_live == dev->cap_live) {
            size_t cap = dev->cap_live ? dev->cap_live * 2 : 16;
            live_bo *nl = (live_bo *)realloc(dev->live, cap * sizeof *nl);
            if (!nl) return ork_err_set(err, ORK_ENOMEM, "npu emu: out of memory");
            dev->live = nl;
            dev->cap_live = cap;
        }
        bo->cpu = (uint8_t *)aligned_alloc(PAGE, size);
        if (!bo->cpu) return ork_err_set(err, ORK_ENOMEM, "npu emu: out of memory for a %llu-byte buffer", (unsigned long long)size);
        memset(bo->cpu, 0, size);
        bo->dma = (uint32_t)cand;
        bo->handle = dev->next_handle++;
        dev->live[dev->n_live++] = (live_bo){bo->dma, size, bo->cpu};
        return ORK_OK;
    }
    const ork_npu_sys *s = dev->sys;
    int rc, e = 0;
    if (dev->kind == ORK_NPU_BE_RKNPU) {
        ork_rknpu_mem_create c;
        memset(&c, 0, sizeof c);
        /* operand buffers: IOMMU-mapped pages, cacheable (synced with MEM_SYNC);
         * the task array must be readable by the kernel (KERNEL_MAPPING) */
        c.flags = usage == ORK_NPU_BO_TASKS ? ORK_RKNPU_MEM_KERNEL_MAPPING
                                            : ORK_RKNPU_MEM_NON_CONTIGUOUS | ORK_RKNPU_MEM_CACHEABLE;
        c.size = size;
        if ((rc = s->ioctl(s->ctx, dev->fd, ORK_RKNPU_IOCTL_MEM_CREATE, &c))) return sys_fail(dev, "RKNPU_MEM_CREATE", rc, err);
        if (c.dma_addr + size > ((uint64_t)1 << 32)) {
            ork_rknpu_mem_destroy d = {c.handle, 0, c.obj_addr};
            s->ioctl(s->ctx, dev->fd, ORK_RKNPU_IOCTL_MEM_DESTROY, &d);
            return ork_err_set(err, ORK_ENPU, "npu: RKNPU_MEM_CREATE gave NPU address 0x%llx, above 4 GiB",
                               (unsigned long long)c.dma_addr);
        }
        ork_rknpu_mem_map m = {c.handle, 0, 0};
        if ((rc = s->ioctl(s->ctx, dev->fd, ORK_RKNPU_IOCTL_MEM_MAP, &m))) {
            ork_rknpu_mem_destroy d = {c.handle, 0, c.obj_addr};
            s->ioctl(s->ctx, dev->fd, ORK_RKNPU_IOCTL_MEM_DESTROY, &d);
            return sys_fail(dev, "RKNPU_MEM_MAP", rc, err);
        }
        void *p = s->mmap(s->ctx, size, dev->fd, m.offset, &e);
        if (!p) {
            ork_rknpu_mem_destroy d = {c.handle, 0, c.obj_addr};
            s->ioctl(s->ctx, dev->fd, ORK_RKNPU_IOCTL_MEM_DESTROY, &d);
            return sys_fail(dev, "mmap of an rknpu buffer", -e, err);
        }
        bo->handle = c.handle;
        bo->dma = (uint32_t)c.dma_addr;
        bo->obj_addr = c.obj_addr;
        bo->map_offset = m.offset;
        bo->flags = c.flags;
        bo->cpu = (uint8_t *)p;
        return ORK_OK;
    }
    ork_rocket_create_bo c;
    memset(&c, 0, sizeof c);
    c.size = (uint32_t)size;
    if ((rc = s->ioctl(s->ctx, dev->fd, ORK_ROCKET_IOCTL_CREATE_BO, &c))) return sys_fail(dev, "ROCKET_CREATE_BO", rc, err);
    ork_drm_gem_close gc = {c.handle, 0};
    if (c.dma_address + size > ((uint64_t)1 << 32)) {
        s->ioctl(s->ctx, dev->fd, ORK_DRM_IOCTL_GEM_CLOSE, &gc);
        return ork_err_set(err, ORK_ENPU, "npu: ROCKET_CREATE_BO gave NPU address 0x%llx, above 4 GiB",
                           (unsigned long long)c.dma_address);
    }
    void *p = s->mmap(s->ctx, size, dev->fd, c.offset, &e);
    if (!p) {
        s->ioctl(s->ctx, dev->fd, ORK_DRM_IOCTL_GEM_CLOSE, &gc);
        return sys_fail(dev, "mmap of a rocket buffer", -e, err);
    }
    bo->handle = c.handle;
    bo->dma = (uint32_t)c.dma_address;
    bo->map_offset = c.offset;
    bo->cpu = (uint8_t *)p;
    return ORK_OK;
}

void ork_npu_bo_free(ork_npu_dev *dev, ork_npu_bo *bo) {
    if (!dev || !bo || !bo->cpu) return;
    if (dev->kind == ORK_NPU_BE_EMU) {
        for (size_t i = 0; i < dev->n_live; i++)
            if (dev->live[i].cpu == bo->cpu) {
                dev->live[i] = dev->live[--dev->n_live];
                break;
            }
        free(bo->cpu);
    } else {
        const ork_npu_sys *s = dev->sys;
        s->munmap(s->ctx, bo->cpu, bo->size);
        if (dev->kind == ORK_NPU_BE_RKNPU) {
            ork_rknpu_mem_destroy d = {bo->handle, 0, bo->obj_addr};
            s->ioctl(s->ctx, dev->fd, ORK_RKNPU_IOCTL_MEM_DESTROY, &d);
        } else {
            ork_drm_gem_close gc = {bo->handle, 0};
            s->ioctl(s->ctx, dev->fd, ORK_DRM_IOCTL_GEM_CLOSE, &gc);
        }
    }
    memset(bo, 0, sizeof *bo);
}

/* CPU writes -> NPU (rknpu: MEM_SYNC TO_DEVICE; rocket: FINI_BO) */
static ork_status to_device(ork_npu_dev *dev, const ork_npu_bo *bo, uint64_t bytes, ork_err *err) {
    dev->to_dev += bytes;
    if (dev->kind == ORK_NPU_BE_EMU) return ORK_OK;
    const ork_npu_sys *s = dev->sys;
    int rc;
    if (dev->kind == ORK_NPU_BE_RKNPU) {
        if (!(bo->flags & ORK_RKNPU_MEM_CACHEABLE)) return ORK_OK;
        ork_rknpu_mem_sync y = {ORK_RKNPU_MEM_SYNC_TO_DEVICE, 0, bo->obj_addr, 0, bo->size};
        if ((rc = s->ioctl(s->ctx, dev->fd, ORK_RKNPU_IOCTL_MEM_SYNC, &y))) return sys_fail(dev, "RKNPU_MEM_SYNC(TO_DEVICE)", rc, err);
        return ORK_OK;
    }
    ork_rocket_fini_bo f = {bo->handle, 0};
    if ((rc = s->ioctl(s->ctx, dev->fd, ORK_ROCKET_IOCTL_FINI_BO, &f))) return sys_fail(dev, "ROCKET_FINI_BO", rc, err);
    return ORK_OK;
}

/* NPU writes -> CPU (rknpu: MEM_SYNC FROM_DEVICE; rocket: PREP_BO waits for the job, absolute deadline) */
static ork_status from_device(ork_npu_dev *dev, const ork_npu_bo *bo, uint64_t bytes, uint32_t timeout_ms, ork_err *err) {
    dev->from_dev += bytes;
    if (dev->kind == ORK_NPU_BE_EMU) return ORK_OK;
    const ork_npu_sys *s = dev->sys;
    int rc;
    if (dev->kind == ORK_NPU_BE_RKNPU) {
        if (!(bo->flags & ORK_RKNPU_MEM_CACHEABLE)) return ORK_OK;
        ork_rknpu_mem_sync y = {ORK_RKNPU_MEM_SYNC_FROM_DEVICE, 0, bo->obj_addr, 0, bo->size};
        if ((rc = s->ioctl(s->ctx, dev->fd, ORK_RKNPU_IOCTL_MEM_SYNC, &y))) return sys_fail(dev, "RKNPU_MEM_SYNC(FROM_DEVICE)", rc, err);
        return ORK_OK;
    }
    ork_rocket_prep_bo p;
    memset(&p, 0, sizeof p);
    p.handle = bo->handle;
    p.timeout_ns = s->monotonic_ns(s->ctx) + (int64_t)timeout_ms * 1000000;
    if ((rc = s->ioctl(s->ctx, dev->fd, ORK_ROCKET_IOCTL_PREP_BO, &p))) {
        if (rc == -EBUSY || rc == -ETIMEDOUT || rc == -ETIME)
            return ork_err_set(err, ORK_ETIMEDOUT, "npu: rocket job did not finish within %u ms (PREP_BO: %s)", timeout_ms,
                               strerror(-rc));
        return sys_fail(dev, "ROCKET_PREP_BO", rc, err);
    }
    return ORK_OK;
}

static ork_status scratch(ork_npu_dev *dev, ork_npu_bo *bo, int *have, uint64_t size, ork_npu_bo_usage usage,
                          ork_err *err) {
    if (*have && bo->size >= size) return ORK_OK;
    if (*have) ork_npu_bo_free(dev, bo);
    *have = 0;
    ork_status st = ork_npu_bo_alloc(dev, size, usage, bo, err);
    if (st == ORK_OK) *have = 1;
    return st;
}

/* ------------------------------------------------------------ submit ---- */
/* one submit of every task of a chain (commands in cmd, operands in in / out and the weights' buffers) */
static ork_status submit(ork_npu_dev *dev, const ork_npu_chain *c, const ork_npu_bo *cmd, const ork_npu_bo *in,
                         const ork_npu_bo *out, const ork_npu_weight *const *w, uint32_t timeout_ms, ork_err *err) {
    const uint32_t n = c->n_tasks, amount = ork_npu_pc_amount(ORK_NPU_TASK_BODY);
    dev->submits++;
    dev->n_tasks += n;
    if (dev->kind == ORK_NPU_BE_EMU) {
        ork_npu_mem mem = {dev, emu_map};
        return ork_npu_emu_run(&mem, ork_npu_chain_task_addr(c, cmd->dma, 0), amount, n, NULL, NULL, err);
    }
    const ork_npu_sys *s = dev->sys;
    int rc;
    if (dev->kind == ORK_NPU_BE_RKNPU) {
        ork_status st = scratch(dev, &dev->tasks, &dev->have_tasks, (uint64_t)n * sizeof(ork_rknpu_task), ORK_NPU_BO_TASKS, err);
        if (st) return st;
        ork_rknpu_task *tk = (ork_rknpu_task *)(void *)dev->tasks.cpu;
        for (uint32_t t = 0; t < n; t++) {
            ork_rknpu_task r;
            memset(&r, 0, sizeof r);
            r.enable_mask = 0xd;
            r.int_mask = 0x300; /* DPU done (both ping-pong groups) */
            r.int_clear = ORK_RKNPU_INT_CLEAR_ALL;
            r.regcfg_amount = ORK_NPU_TASK_BODY;
            r.regcmd_addr = ork_npu_chain_task_addr(c, cmd->dma, t);
            memcpy(&tk[t], &r, sizeof r);
        }
        for (uint32_t start = 0; start < n; start += ORK_RKNPU_MAX_TASKS) {
            uint32_t cnt = n - start < ORK_RKNPU_MAX_TASKS ? n - start : ORK_RKNPU_MAX_TASKS;
            ork_rknpu_submit sb;
            memset(&sb, 0, sizeof sb);
            sb.flags = ORK_RKNPU_JOB_PC | ORK_RKNPU_JOB_PINGPONG; /* blocking */
            sb.timeout = timeout_ms;
            sb.task_start = start;
            sb.task_number = cnt;
            sb.task_obj_addr = dev->tasks.obj_addr;
            sb.core_mask = 1;
            sb.fence_fd = -1;
            sb.subcore_task[0].task_start = start;
            sb.subcore_task[0].task_number = cnt;
            if ((rc = s->ioctl(s->ctx, dev->fd, ORK_RKNPU_IOCTL_SUBMIT, &sb))) {
                ork_rknpu_action a = {ORK_RKNPU_ACT_RESET, 0};
                s->ioctl(s->ctx, dev->fd, ORK_RKNPU_IOCTL_ACTION, &a);
                if (rc == -ETIMEDOUT || rc == -ETIME)
                    return ork_err_set(err, ORK_ETIMEDOUT, "npu: rknpu job of %u tasks did not finish within %u ms (core reset)",
                                       cnt, timeout_ms);
                return sys_fail(dev, "RKNPU_SUBMIT", rc, err);
            }
        }
        return ORK_OK;
    }
    ork_rocket_task *tk = (ork_rocket_task *)malloc((size_t)n * sizeof *tk);
    uint32_t *in_h = (uint32_t *)malloc(((size_t)c->n + 2) * sizeof *in_h), out_h[1] = {out->handle};
    if (!tk || !in_h) {
        free(tk);
        free(in_h);
        return ork_err_set(err, ORK_ENOMEM, "npu: out of memory for %u tasks", n);
    }
    for (uint32_t t = 0; t < n; t++) {
        tk[t].regcmd = ork_npu_chain_task_addr(c, cmd->dma, t);
        tk[t].regcmd_count = ORK_NPU_TASK_QWORDS; /* rocket counts the tail */
    }
    in_h[0] = cmd->handle; /* commands, input, then every weight */
    in_h[1] = in->handle;
    for (uint32_t i = 0; i < c->n; i++) in_h[2 + i] = w[i]->bo.handle;
    ork_rocket_job job;
    memset(&job, 0, sizeof job);
    job.tasks = (uint64_t)(uintptr_t)tk;
    job.task_count = n;
    job.task_struct_size = sizeof(ork_rocket_task);
    job.in_bo_handles = (uint64_t)(uintptr_t)in_h;
    job.in_bo_handle_count = c->n + 2;
    job.out_bo_handles = (uint64_t)(uintptr_t)out_h;
    job.out_bo_handle_count = 1;
    ork_rocket_submit sb;
    memset(&sb, 0, sizeof sb);
    sb.jobs = (uint64_t)(uintptr_t)&job;
    sb.job_count = 1;
    sb.job_struct_size = sizeof job;
    rc = s->ioctl(s->ctx, dev->fd, ORK_ROCKET_IOCTL_SUBMIT, &sb);
    free(tk);
    free(in_h);
    if (rc) return sys_fail(dev, "ROCKET_SUBMIT", rc, err);
    return ORK_OK;
}

/* ------------------------------------------------------------ matmul ---- */
static ork_status upload_common(ork_npu_dev *dev, uint32_t N, uint32_t K, const ork_npu_plan_opts *opts,
                                ork_npu_weight *w, ork_npu_plan *p, ork_err *err) {
    if (!dev || !w) return ork_err_set(err, ORK_EINVAL, "npu weight upload: NULL argument");
    memset(w, 0, sizeof *w);
    ork_status st = ork_npu_plan_make(1, K, N, opts, p, err);
    if (st) return st;
    w->K = K;
    w->N = N;
    if (opts) w->opts = *opts;
    st = ork_npu_bo_alloc(dev, p->w_bytes, ORK_NPU_BO_INPUT, &w->bo, err);
    if (st) ork_npu_plan_free(p);
    return st;
}

ork_status ork_npu_weight_upload_i8(ork_npu_dev *dev, const int8_t *B, uint32_t N, uint32_t K, size_t ldb,
                                    const ork_npu_plan_opts *opts, ork_npu_weight *w, ork_err *err) {
    ork_npu_plan p;
    ork_status st = upload_common(dev, N, K, opts, w, &p, err);
    if (st) return st;
    if (!(st = ork_npu_pack_weights(&p, B, ldb, w->bo.cpu, err))) st = to_device(dev, &w->bo, p.w_bytes, err);
    ork_npu_plan_free(&p);
    if (st) ork_npu_bo_free(dev, &w->bo);
    return st;
}

ork_status ork_npu_weight_upload_store(ork_npu_dev *dev, ork_kind kind, const void *store, const int8_t lut[16],
                                       uint32_t N, uint32_t K, const ork_npu_plan_opts *opts, ork_npu_weight *w,
                                       ork_err *err) {
    ork_npu_plan p;
    ork_status st = upload_common(dev, N, K, opts, w, &p, err);
    if (st) return st;
    if (!(st = ork_npu_pack_weights_store(&p, kind, store, lut, w->bo.cpu, err)))
        st = to_device(dev, &w->bo, p.w_bytes, err);
    ork_npu_plan_free(&p);
    if (st) ork_npu_bo_free(dev, &w->bo);
    return st;
}

void ork_npu_weight_free(ork_npu_dev *dev, ork_npu_weight *w) {
    if (w && w->bo.cpu) ork_npu_bo_free(dev, &w->bo);
}

/* Pack every input, submit the chain once, check and unpack every output: the
 * common part of ork_npu_matmul and ork_npu_job_run (the command buffer is
 * already emitted and synced). */
static ork_status run_chain(ork_npu_dev *dev, const ork_npu_chain *c, const ork_npu_weight *const *w, ork_npu_bo *cmd,
                            ork_npu_bo *in, ork_npu_bo *out, const int8_t *const *A, const size_t *lda,
                            int32_t *const *C, uint32_t timeout_ms, ork_err *err) {
    ork_status st;
    for (uint32_t i = 0; i < c->n; i++)
        if ((st = ork_npu_pack_input(&c->plans[i], A[i], lda[i], in->cpu + c->in_at[i], err))) return st;
    if ((st = to_device(dev, in, c->in_bytes, err))) return st;
    if (dev->kind != ORK_NPU_BE_EMU) { /* sentinels: a job the kernel dropped must not return stale results */
        for (uint32_t i = 0; i < c->n; i++) fill_sentinels(&c->plans[i], out->cpu + c->out_at[i]);
        if ((st = to_device(dev, out, c->out_bytes, err))) return st;
    }
    if ((st = submit(dev, c, cmd, in, out, w, timeout_ms, err)) ||
        (st = from_device(dev, out, c->out_bytes, timeout_ms, err)))
        return st;
    for (uint32_t i = 0, t0 = 0; i < c->n; t0 += c->plans[i].n_tasks, i++) {
        const ork_npu_plan *p = &c->plans[i];
        for (uint32_t t = 0; dev->kind != ORK_NPU_BE_EMU && t < p->n_tasks; t++)
            if (unwritten(p, &p->tasks[t], out->cpu + c->out_at[i]))
                return ork_err_set(err, ORK_ENPU, "npu: the %s job reported success but task %u of %u did not "
                                   "write its output (the driver dropped the job?)", kind_name(dev->kind), t0 + t,
                                   c->n_tasks);
        if ((st = ork_npu_unpack_output(p, out->cpu + c->out_at[i], C[i], err))) return st;
    }
    return ORK_OK;
}

/* after a rocket timeout the job may still run: never reuse its buffers (the
 * kernel keeps them alive until its fence) */
static int drop_after_timeout(ork_npu_dev *dev, ork_status st, ork_npu_bo *cmd, ork_npu_bo *in, ork_npu_bo *out) {
    if (dev->kind != ORK_NPU_BE_ROCKET || st != ORK_ETIMEDOUT) return 0;
    ork_npu_bo_free(dev, cmd);
    ork_npu_bo_free(dev, in);
    ork_npu_bo_free(dev, out);
    return 1;
}

ork_status ork_npu_matmul(ork_npu_dev *dev, const ork_npu_weight *w, const int8_t *A, uint32_t M, size_t lda,
                          int32_t *C, uint32_t timeout_ms, ork_err *err) {
    if (!dev || !w || !w->bo.cpu || !A || !C) return ork_err_set(err, ORK_EINVAL, "npu matmul: NULL argument");
    if (timeout_ms == 0) return ork_err_set(err, ORK_EINVAL, "npu matmul: timeout must be > 0 ms");
    ork_npu_chain c; /* a chain of one, planned and emitted for this call into the device's scratch buffers */
    ork_status st = ork_npu_chain_make(1, &M, &w->K, &w->N, &w->opts, &c, err);
    if (st) return st;
    if ((st = scratch(dev, &dev->cmd, &dev->have_cmd, c.cmd_bytes, ORK_NPU_BO_CMD, err)) ||
        (st = scratch(dev, &dev->in, &dev->have_in, c.in_bytes, ORK_NPU_BO_INPUT, err)) ||
        (st = scratch(dev, &dev->out, &dev->have_out, c.out_bytes, ORK_NPU_BO_OUTPUT, err)) ||
        (st = ork_npu_chain_emit(&c, dev->cmd.dma, dev->in.dma, &w->bo.dma, dev->out.dma,
                                 (uint64_t *)(void *)dev->cmd.cpu, err)) ||
        (st = to_device(dev, &dev->cmd, c.cmd_bytes, err)))
        goto done;
    dev->plans++;
    st = run_chain(dev, &c, &w, &dev->cmd, &dev->in, &dev->out, &A, &lda, &C, timeout_ms, err);
    if (drop_after_timeout(dev, st, &dev->cmd, &dev->in, &dev->out)) dev->have_cmd = dev->have_in = dev->have_out = 0;
done:
    ork_npu_chain_free(&c);
    return st;
}

/* ------------------------------------------------- planned-once jobs ---- */
/* the job's own buffers, its command buffer emitted and synced once */
static ork_status job_emit(ork_npu_dev *dev, ork_npu_job *job, ork_err *err) {
    const ork_npu_chain *c = &job->chain;
    uint32_t *wa = (uint32_t *)malloc((size_t)job->n * sizeof *wa);
    if (!wa) return ork_err_set(err, ORK_ENOMEM, "npu job: out of memory");
    for (uint32_t i = 0; i < job->n; i++) wa[i] = job->w[i]->bo.dma;
    ork_status st;
    if ((st = ork_npu_bo_alloc(dev, c->cmd_bytes, ORK_NPU_BO_CMD, &job->cmd, err)) ||
        (st = ork_npu_bo_alloc(dev, c->in_bytes, ORK_NPU_BO_INPUT, &job->in, err)) ||
        (st = ork_npu_bo_alloc(dev, c->out_bytes, ORK_NPU_BO_OUTPUT, &job->out, err)) ||
        (st = ork_npu_chain_emit(c, job->cmd.dma, job->in.dma, wa, job->out.dma, (uint64_t *)(void *)job->cmd.cpu, err)) ||
        (st = to_device(dev, &job->cmd, c->cmd_bytes, err))) {
        ork_npu_bo_free(dev, &job->cmd);
        ork_npu_bo_free(dev, &job->in);
        ork_npu_bo_free(dev, &job->out);
    } else {
        dev->plans++;
        job->emitted = 1;
    }
    free(wa);
    return st;
}

void ork_npu_job_free(ork_npu_dev *dev, ork_npu_job *job) {
    if (!job) return;
    if (dev) {
        ork_npu_bo_free(dev, &job->cmd);
        ork_npu_bo_free(dev, &job->in);
        ork_npu_bo_free(dev, &job->out);
    }
    ork_npu_chain_free(&job->chain);
    free((void *)job->w);
    memset(job, 0, sizeof *job);
}

ork_status ork_npu_job_make(ork_npu_dev *dev, const ork_npu_weight *const *w, uint32_t n, uint32_t M, ork_npu_job *job,
                            ork_err *err) {
    if (!job) return ork_err_set(err, ORK_EINVAL, "npu job: NULL output");
    memset(job, 0, sizeof *job);
    if (!dev || !w || n == 0) return ork_err_set(err, ORK_EINVAL, "npu job: no weights");
    for (uint32_t i = 0; i < n; i++)
        if (!w[i] || !w[i]->bo.cpu) return ork_err_set(err, ORK_EINVAL, "npu job: weight %u is not resident", i);
    uint32_t *dims = (uint32_t *)malloc((size_t)3 * n * sizeof *dims);
    ork_npu_plan_opts *opts = (ork_npu_plan_opts *)malloc((size_t)n * sizeof *opts);
    job->w = (const ork_npu_weight **)malloc((size_t)n * sizeof *job->w);
    ork_status st = ORK_OK;
    if (!dims || !opts || !job->w) {
        st = ork_err_set(err, ORK_ENOMEM, "npu job: out of memory for %u matmuls", n);
    } else {
        for (uint32_t i = 0; i < n; i++) {
            dims[i] = M;
            dims[n + i] = w[i]->K;
            dims[2 * (size_t)n + i] = w[i]->N;
            opts[i] = w[i]->opts;
            job->w[i] = w[i];
        }
        job->n = n;
        job->M = M;
        if (!(st = ork_npu_chain_make(n, dims, dims + n, dims + 2 * (size_t)n, opts, &job->chain, err)))
            st = job_emit(dev, job, err);
    }
    free(dims);
    free(opts);
    if (st) ork_npu_job_free(dev, job);
    return st;
}

ork_status ork_npu_job_run(ork_npu_dev *dev, ork_npu_job *job, const int8_t *const *A, const size_t *lda,
                           int32_t *const *C, uint32_t timeout_ms, ork_err *err) {
    if (!dev || !job || !job->w || !A || !lda || !C) return ork_err_set(err, ORK_EINVAL, "npu job run: NULL argument");
    if (timeout_ms == 0) return ork_err_set(err, ORK_EINVAL, "npu job run: timeout must be > 0 ms");
    for (uint32_t i = 0; i < job->n; i++) {
        if (!A[i] || !C[i] || lda[i] < job->w[i]->K)
            return ork_err_set(err, ORK_EINVAL, "npu job run: bad input or output %u of %u", i + 1, job->n);
        if (!job->w[i]->bo.cpu) return ork_err_set(err, ORK_EINVAL, "npu job run: weight %u was freed", i + 1);
    }
    ork_status st;
    if (!job->emitted && (st = job_emit(dev, job, err))) return st;
    st = run_chain(dev, &job->chain, job->w, &job->cmd, &job->in, &job->out, A, lda, C, timeout_ms, err);
    if (drop_after_timeout(dev, st, &job->cmd, &job->in, &job->out)) job->emitted = 0;
    return st;
}
