/* test_npu.c - the NPU pipeline in C (plan -> layouts -> chained commands ->
 * emulator, through the emu backend and both device backends over the fake
 * kernel), natively and under qemu-aarch64, and the fake kernel's contract
 * checks driven with raw, deliberately wrong driver calls. */
#include <errno.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../csrc/ork/npu/backend.h"
#include "../npu_fake/fake_kernel.h"
#include "../../csrc/ork/npu/regcmd.h"
#include "../../csrc/ork/npu/uapi.h"
#include "check.h"

static uint64_t rng = 88172645463325252ull;
static char last_msg[256]; /* the fake kernel's message right after the call under test */
static void save_msg(ork_fake_kernel *k) { snprintf(last_msg, sizeof last_msg, "%s", ork_fake_kernel_last_error(k)); }
static int8_t rnd8(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (int8_t)(rng >> 24);
}

static int matmul_ok(ork_npu_dev *dev, uint32_t M, uint32_t K, uint32_t N, const ork_npu_plan_opts *o) {
    int8_t *A = malloc((size_t)M * K), *B = malloc((size_t)N * K);
    int32_t *C = malloc((size_t)M * N * 4);
    const int i4 = o && o->precision == ORK_NPU_PREC_INT4; /* int4 codes in [-8, 7], the first row all -8 */
    for (size_t i = 0; i < (size_t)M * K; i++) A[i] = i4 ? (int8_t)(i < K ? -8 : (rnd8() & 15) - 8) : rnd8();
    for (size_t i = 0; i < (size_t)N * K; i++) B[i] = i4 ? (int8_t)(i < K ? -8 : (rnd8() & 15) - 8) : rnd8();
    ork_npu_weight w;
    ork_err e;
    e.msg[0] = 0;
    int ok = ork_npu_weight_upload_i8(dev, B, N, K, K, o, &w, &e) == ORK_OK &&
             ork_npu_matmul(dev, &w, A, M, K, C, 1000, &e) == ORK_OK;
    if (!ok) printf("matmul %ux%ux%u: %s\n", M, K, N, e.msg);
    for (uint32_t m = 0; ok && m < M; m++)
        for (uint32_t n = 0; ok && n < N; n++) {
            int64_t s = 0;
            for (uint32_t k = 0; k < K; k++) s += (int64_t)A[(size_t)m * K + k] * B[(size_t)n * K + k];
            ok = s == C[(size_t)m * N + n];
        }
    if (w.bo.cpu) ork_npu_weight_free(dev, &w);
    free(A);
    free(B);
    free(C);
    return ok;
}

static void pipeline(void) {
    static const uint32_t shapes[][6] = {{1, 64, 32, 0, 0, 0},     {4, 100, 50, 0, 0, 0},   {5, 8192, 64, 0, 0, 0},
                                         {64, 300, 70, 16, 64, 32}, {1, 9000, 96, 0, 0, 0}, {13, 200, 130, 4, 32, 32}};
    static const uint32_t i4shapes[][6] = {{1, 481, 64, 0, 0, 0}, {37, 2048, 100, 0, 0, 0}, {9, 700, 130, 4, 64, 64}};
    for (int b = 0; b < 3; b++) {
        ork_fake_kernel *fk = NULL;
        const ork_npu_sys *sys = NULL;
        if (b) {
            ork_fake_kernel_new(b == 1 ? ORK_FAKE_RKNPU : ORK_FAKE_ROCKET, &fk, NULL);
            sys = ork_fake_kernel_sys(fk);
        }
        ork_npu_dev *dev = NULL;
        ork_err e;
        e.msg[0] = 0;
        ork_status st = ork_npu_dev_open((ork_npu_backend_kind)b, sys, 0, &dev, &e);
        CHECK(st == ORK_OK, "open backend %d: %s", b, e.msg);
        if (st) continue;
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            ork_npu_plan_opts o = {shapes[i][3], shapes[i][4], shapes[i][5], ORK_NPU_PREC_INT8};
            CHECK(matmul_ok(dev, shapes[i][0], shapes[i][1], shapes[i][2], &o), "backend %d shape %zu", b, i);
        }
        /* int4 x int4 -> int16 tiles (K <= 480 per task), summed in int32: -8 x -8 over K = 2048 is 131072 */
        for (size_t i = 0; i < sizeof i4shapes / sizeof i4shapes[0]; i++) {
            ork_npu_plan_opts o = {i4shapes[i][3], i4shapes[i][4], i4shapes[i][5], ORK_NPU_PREC_INT4};
            CHECK(matmul_ok(dev, i4shapes[i][0], i4shapes[i][1], i4shapes[i][2], &o), "backend %d int4 shape %zu", b, i);
        }
        ork_npu_dev_close(dev);
        if (fk) {
            ork_fake_stats s;
            ork_fake_kernel_get_stats(fk, &s);
            CHECK(s.live_bos == 0 && s.mapped == 0 && s.refused == 0, "backend %d leaves %llu buffers, %llu maps, %llu refusals",
                  b, (unsigned long long)s.live_bos, (unsigned long long)s.mapped, (unsigned long long)s.refused);
            ork_fake_kernel_free(fk);
        }
    }
}

/* ----------------------------------------------- raw calls, fake rknpu */
typedef struct {
    uint32_t handle;
    uint64_t obj, dma, off;
    uint8_t *p;
    uint64_t size;
} rbo;

static int r_create(const ork_npu_sys *s, int fd, uint64_t size, uint32_t flags, rbo *b) {
    ork_rknpu_mem_create c;
    memset(&c, 0, sizeof c);
    c.size = size;
    c.flags = flags;
    int rc = s->ioctl(s->ctx, fd, ORK_RKNPU_IOCTL_MEM_CREATE, &c);
    if (rc) return rc;
    ork_rknpu_mem_map m = {c.handle, 0, 0};
    if ((rc = s->ioctl(s->ctx, fd, ORK_RKNPU_IOCTL_MEM_MAP, &m))) return rc;
    int en = 0;
    b->p = s->mmap(s->ctx, (size + 4095) & ~4095ull, fd, m.offset, &en);
    b->handle = c.handle;
    b->obj = c.obj_addr;
    b->dma = c.dma_addr;
    b->off = m.offset;
    b->size = (size + 4095) & ~4095ull;
    return b->p ? 0 : -en;
}

static int r_sync(const ork_npu_sys *s, int fd, rbo *b, uint32_t dir) {
    ork_rknpu_mem_sync y = {dir, 0, b->obj, 0, b->size};
    return s->ioctl(s->ctx, fd, ORK_RKNPU_IOCTL_MEM_SYNC, &y);
}

/* a 2-task chained matmul in raw buffers; returns the submit rc */
static int rknpu_job(ork_fake_kernel *k, const ork_npu_sys *s, int fd, uint32_t task_flags_mask, uint32_t amount, int sync_inputs,
                     int use_task_bo, int32_t *out_first) {
    ork_npu_plan p;
    ork_npu_plan_opts o = {0, 0, 32};
    ork_npu_plan_make(4, 64, 64, &o, &p, NULL); /* 2 tasks (N split) */
    rbo cmd, in, w, out, tasks;
    const uint32_t cach = ORK_RKNPU_MEM_CACHEABLE;
    r_create(s, fd, p.cmd_bytes, cach, &cmd);
    r_create(s, fd, p.in_bytes, cach, &in);
    r_create(s, fd, p.w_bytes, cach, &w);
    r_create(s, fd, p.out_bytes, cach, &out);
    r_create(s, fd, 2 * sizeof(ork_rknpu_task), task_flags_mask, &tasks);
    ork_npu_plan_emit(&p, (uint32_t)cmd.dma, (uint32_t)in.dma, (uint32_t)w.dma, (uint32_t)out.dma, (uint64_t *)(void *)cmd.p,
                      NULL);
    int8_t A[4 * 64], B[64 * 64];
    for (int i = 0; i < 4 * 64; i++) A[i] = 1;
    for (int i = 0; i < 64 * 64; i++) B[i] = 2;
    ork_npu_pack_input(&p, A, 64, in.p, NULL);
    ork_npu_pack_weights(&p, B, 64, w.p, NULL);
    if (sync_inputs) {
        r_sync(s, fd, &cmd, ORK_RKNPU_MEM_SYNC_TO_DEVICE);
        r_sync(s, fd, &in, ORK_RKNPU_MEM_SYNC_TO_DEVICE);
        r_sync(s, fd, &w, ORK_RKNPU_MEM_SYNC_TO_DEVICE);
    }
    ork_rknpu_task *tk = (ork_rknpu_task *)(void *)tasks.p;
    for (int t = 0; t < 2; t++) {
        ork_rknpu_task r;
        memset(&r, 0, sizeof r);
        r.enable_mask = 0xd;
        r.int_mask = 0x300;
        r.int_clear = 0x1ffff;
        r.regcfg_amount = amount;
        r.regcmd_addr = cmd.dma + p.tasks[t].cmd_off;
        memcpy(&tk[t], &r, sizeof r);
    }
    ork_rknpu_submit sb;
    memset(&sb, 0, sizeof sb);
    sb.flags = ORK_RKNPU_JOB_PC | ORK_RKNPU_JOB_PINGPONG;
    sb.timeout = 1000;
    sb.task_number = 2;
    sb.task_obj_addr = use_task_bo ? tasks.obj : in.obj;
    sb.core_mask = 1;
    sb.fence_fd = -1;
    sb.subcore_task[0].task_number = 2;
    int rc = s->ioctl(s->ctx, fd, ORK_RKNPU_IOCTL_SUBMIT, &sb);
    save_msg(k);
    if (rc == 0 && out_first) {
        r_sync(s, fd, &out, ORK_RKNPU_MEM_SYNC_FROM_DEVICE);
        int32_t C[4 * 64];
        ork_npu_unpack_output(&p, out.p, C, NULL);
        *out_first = C[0];
    }
    rbo *all[5] = {&cmd, &in, &w, &out, &tasks};
    for (int i = 0; i < 5; i++) {
        s->munmap(s->ctx, all[i]->p, all[i]->size);
        ork_rknpu_mem_destroy d = {all[i]->handle, 0, all[i]->obj};
        s->ioctl(s->ctx, fd, ORK_RKNPU_IOCTL_MEM_DESTROY, &d);
    }
    ork_npu_plan_free(&p);
    return rc;
}

static void rknpu_contract(void) {
    ork_fake_kernel *k;
    ork_fake_kernel_new(ORK_FAKE_RKNPU, &k, NULL);
    const ork_npu_sys *s = ork_fake_kernel_sys(k);
    int fd = s->open(s->ctx, "/dev/dri/renderD128");
    CHECK(fd >= 0, "open");
    int32_t c0 = 0;
    int rc = rknpu_job(k, s, fd, ORK_RKNPU_MEM_KERNEL_MAPPING, ORK_NPU_TASK_BODY, 1, 1, &c0);
    CHECK(rc == 0 && c0 == 128, "the correct raw job runs (rc %d, C[0] %d, %s)", rc, c0, last_msg);
    rc = rknpu_job(k, s, fd, 0, ORK_NPU_TASK_BODY, 1, 1, NULL);
    CHECK(rc == -EFAULT && strstr(last_msg, "KERNEL_MAPPING"), "task BO without KERNEL_MAPPING: %d %s", rc,
          last_msg);
    rc = rknpu_job(k, s, fd, ORK_RKNPU_MEM_KERNEL_MAPPING, ORK_NPU_TASK_BODY, 1, 0, NULL);
    CHECK(rc == -EFAULT, "task_obj_addr of another buffer: %d", rc);
    rc = rknpu_job(k, s, fd, ORK_RKNPU_MEM_KERNEL_MAPPING, ORK_NPU_TASK_QWORDS, 1, 1, NULL);
    CHECK(rc == -EPROTO && strstr(last_msg, "op-enable"),
          "regcfg_amount counting the tail (rocket convention) is refused: %d %s", rc, last_msg);
    rc = rknpu_job(k, s, fd, ORK_RKNPU_MEM_KERNEL_MAPPING, ORK_NPU_TASK_BODY, 0, 1, NULL);
    CHECK(rc == -EINVAL && strstr(last_msg, "MEM_SYNC"), "unsynced cacheable inputs: %d %s", rc,
          last_msg);
    ork_rknpu_mem_map m = {1, 7, 0};
    CHECK(s->ioctl(s->ctx, fd, ORK_RKNPU_IOCTL_MEM_MAP, &m) == -EINVAL, "MEM_MAP with reserved != 0");
    int en = 0;
    CHECK(s->mmap(s->ctx, 4096, fd, 0x12345000, &en) == NULL && en == EINVAL, "mmap at an offset never returned");
    CHECK(s->ioctl(s->ctx, fd, 0xc0086499u, &m) == -ENOTTY, "unknown ioctl");
    ork_fake_kernel_set_faults(k, ORK_FAKE_HANG);
    rc = rknpu_job(k, s, fd, ORK_RKNPU_MEM_KERNEL_MAPPING, ORK_NPU_TASK_BODY, 1, 1, NULL);
    CHECK(rc == -ETIMEDOUT, "injected hang: %d", rc);
    ork_fake_kernel_set_faults(k, 0);
    rc = rknpu_job(k, s, fd, ORK_RKNPU_MEM_KERNEL_MAPPING, ORK_NPU_TASK_BODY, 1, 1, NULL);
    CHECK(rc == -EIO, "after a timeout the core needs a reset: %d", rc);
    ork_rknpu_action a = {ORK_RKNPU_ACT_RESET, 0};
    CHECK(s->ioctl(s->ctx, fd, ORK_RKNPU_IOCTL_ACTION, &a) == 0, "reset");
    rc = rknpu_job(k, s, fd, ORK_RKNPU_MEM_KERNEL_MAPPING, ORK_NPU_TASK_BODY, 1, 1, &c0);
    CHECK(rc == 0 && c0 == 128, "runs again after the reset: %d", rc);
    ork_fake_stats st;
    ork_fake_kernel_get_stats(k, &st);
    CHECK(st.live_bos == 0 && st.mapped == 0, "raw jobs leave nothing behind");
    s->close(s->ctx, fd);
    ork_fake_kernel_free(k);
}

/* ----------------------------------------------- raw calls, fake rocket */
static int rocket_job(ork_fake_kernel *k, int fd, uint32_t count, int fini, uint32_t job_size, int64_t deadline_rel,
                      int absolute, int32_t *c0) {
    const ork_npu_sys *s = ork_fake_kernel_sys(k);
    ork_npu_plan p;
    ork_npu_plan_make(4, 64, 32, NULL, &p, NULL);
    ork_rocket_create_bo bo[4];
    uint8_t *ptr[4];
    uint64_t sz[4] = {p.cmd_bytes, p.in_bytes, p.w_bytes, p.out_bytes};
    for (int i = 0; i < 4; i++) {
        memset(&bo[i], 0, sizeof bo[i]);
        bo[i].size = (uint32_t)((sz[i] + 4095) & ~4095ull);
        s->ioctl(s->ctx, fd, ORK_ROCKET_IOCTL_CREATE_BO, &bo[i]);
        int en;
        ptr[i] = s->mmap(s->ctx, bo[i].size, fd, bo[i].offset, &en);
    }
    ork_npu_plan_emit(&p, (uint32_t)bo[0].dma_address, (uint32_t)bo[1].dma_address, (uint32_t)bo[2].dma_address,
                      (uint32_t)bo[3].dma_address, (uint64_t *)(void *)ptr[0], NULL);
    int8_t A[4 * 64], B[32 * 64];
    for (int i = 0; i < 4 * 64; i++) A[i] = 3;
    for (int i = 0; i < 32 * 64; i++) B[i] = -1;
    ork_npu_pack_input(&p, A, 64, ptr[1], NULL);
    ork_npu_pack_weights(&p, B, 64, ptr[2], NULL);
    if (fini)
        for (int i = 0; i < 3; i++) {
            ork_rocket_fini_bo f = {bo[i].handle, 0};
            s->ioctl(s->ctx, fd, ORK_ROCKET_IOCTL_FINI_BO, &f);
        }
    ork_rocket_task t = {(uint32_t)bo[0].dma_address, count};
    uint32_t in_h[3] = {bo[0].handle, bo[1].handle, bo[2].handle}, out_h[1] = {bo[3].handle};
    ork_rocket_job job;
    memset(&job, 0, sizeof job);
    job.tasks = (uint64_t)(uintptr_t)&t;
    job.task_count = 1;
    job.task_struct_size = sizeof t;
    job.in_bo_handles = (uint64_t)(uintptr_t)in_h;
    job.in_bo_handle_count = 3;
    job.out_bo_handles = (uint64_t)(uintptr_t)out_h;
    job.out_bo_handle_count = 1;
    ork_rocket_submit sb = {(uint64_t)(uintptr_t)&job, 1, job_size, 0};
    int rc = s->ioctl(s->ctx, fd, ORK_ROCKET_IOCTL_SUBMIT, &sb);
    save_msg(k);
    if (rc == 0) {
        ork_rocket_prep_bo pb;
        memset(&pb, 0, sizeof pb);
        pb.handle = bo[3].handle;
        pb.timeout_ns = (absolute ? s->monotonic_ns(s->ctx) : 0) + deadline_rel;
        rc = s->ioctl(s->ctx, fd, ORK_ROCKET_IOCTL_PREP_BO, &pb);
        save_msg(k);
        if (rc == 0 && c0) {
            int32_t C[4 * 32];
            ork_npu_unpack_output(&p, ptr[3], C, NULL);
            *c0 = C[0];
        }
    }
    for (int i = 0; i < 4; i++) {
        ork_drm_gem_close g = {bo[i].handle, 0};
        if (i == 0 && c0) CHECK(s->ioctl(s->ctx, fd, ORK_DRM_IOCTL_GEM_CLOSE, &g) == -EBUSY, "GEM_CLOSE while mapped is refused");
        s->munmap(s->ctx, ptr[i], bo[i].size);
        s->ioctl(s->ctx, fd, ORK_DRM_IOCTL_GEM_CLOSE, &g);
    }
    ork_npu_plan_free(&p);
    return rc;
}

static void rocket_contract(void) {
    ork_fake_kernel *k;
    ork_fake_kernel_new(ORK_FAKE_ROCKET, &k, NULL);
    const ork_npu_sys *s = ork_fake_kernel_sys(k);
    int fd = s->open(s->ctx, "/dev/accel/accel0");
    int32_t c0 = 0;
    int rc = rocket_job(k, fd, ORK_NPU_TASK_QWORDS, 1, sizeof(ork_rocket_job), 1000000000, 1, &c0);
    CHECK(rc == 0 && c0 == -192, "the correct raw rocket job runs (rc %d, C[0] %d, %s)", rc, c0, last_msg);
    rc = rocket_job(k, fd, ORK_NPU_TASK_BODY, 1, sizeof(ork_rocket_job), 1000000000, 1, NULL);
    CHECK(rc == -EPROTO && strstr(last_msg, "without op-enable"),
          "regcmd_count without the tail (vendor convention) never reaches op-enable: %d %s", rc, last_msg);
    rc = rocket_job(k, fd, ORK_NPU_TASK_QWORDS, 0, sizeof(ork_rocket_job), 1000000000, 1, NULL);
    CHECK(rc == -EINVAL && strstr(last_msg, "FINI_BO"), "no FINI_BO: %d %s", rc,
          last_msg);
    rc = rocket_job(k, fd, ORK_NPU_TASK_QWORDS, 1, 32, 1000000000, 1, NULL);
    CHECK(rc == -EINVAL, "job_struct_size 32: %d", rc);
    rc = rocket_job(k, fd, ORK_NPU_TASK_QWORDS, 1, sizeof(ork_rocket_job), 1000000000, 0, NULL);
    CHECK(rc == -EBUSY && strstr(last_msg, "absolute"), "relative PREP_BO timeout: %d %s", rc,
          last_msg);
    ork_fake_kernel_set_faults(k, ORK_FAKE_HANG);
    rc = rocket_job(k, fd, ORK_NPU_TASK_QWORDS, 1, sizeof(ork_rocket_job), 1000000000, 1, NULL);
    CHECK(rc == -ETIMEDOUT, "hang: PREP_BO times out: %d", rc);
    ork_fake_kernel_set_faults(k, 0);
    ork_rocket_submit bad = {0, 1, 40, 5};
    CHECK(s->ioctl(s->ctx, fd, ORK_ROCKET_IOCTL_SUBMIT, &bad) == -EINVAL, "reserved != 0");
    ork_rocket_fini_bo f = {999, 0};
    CHECK(s->ioctl(s->ctx, fd, ORK_ROCKET_IOCTL_FINI_BO, &f) == -ENOENT, "unknown handle");
    ork_fake_stats st;
    ork_fake_kernel_get_stats(k, &st);
    CHECK(st.live_bos == 0 && st.mapped == 0, "raw rocket jobs leave nothing behind");
    s->close(s->ctx, fd);
    ork_fake_kernel_free(k);
}

static void discovery(void) {
    ork_fake_kernel *k;
    ork_fake_kernel_new(ORK_FAKE_RKNPU, &k, NULL);
    ork_fake_kernel_set_faults(k, ORK_FAKE_NO_DEVICE);
    ork_npu_dev *dev = NULL;
    ork_err e;
    e.msg[0] = 0;
    ork_status st = ork_npu_dev_open(ORK_NPU_BE_RKNPU, ork_fake_kernel_sys(k), 0, &dev, &e);
    CHECK(st == ORK_ENPUUNAVAIL && strstr(e.msg, "simpledrm"), "a foreign DRM node is not taken for rknpu: %d %s", st, e.msg);
    ork_fake_kernel_free(k);
    /* the fake rocket kernel has no /dev/dri/renderD* rknpu node */
    ork_fake_kernel_new(ORK_FAKE_ROCKET, &k, NULL);
    st = ork_npu_dev_open(ORK_NPU_BE_RKNPU, ork_fake_kernel_sys(k), 0, &dev, &e);
    CHECK(st == ORK_ENPUUNAVAIL, "no rknpu node on a rocket system: %d", st);
    ork_fake_kernel_free(k);
}

/* freed NPU address ranges are reused: 6.4 GB of short-lived buffers next to a
 * long-lived one never exhaust the 32-bit space (emu and both fake kernels) */
static void address_reuse(void) {
    for (int b = 0; b < 3; b++) {
        ork_fake_kernel *fk = NULL;
        if (b) ork_fake_kernel_new(b == 1 ? ORK_FAKE_RKNPU : ORK_FAKE_ROCKET, &fk, NULL);
        ork_npu_dev *dev = NULL;
        ork_npu_dev_open((ork_npu_backend_kind)b, fk ? ork_fake_kernel_sys(fk) : NULL, 0, &dev, NULL);
        ork_npu_bo keep[2], tmp;
        ork_err e;
        e.msg[0] = 0;
        int ok = ork_npu_bo_alloc(dev, 4096, ORK_NPU_BO_INPUT, &keep[0], &e) == ORK_OK;
        for (int i = 0; ok && i < 200; i++) {
            ok = ork_npu_bo_alloc(dev, (32u << 20) + 4096u * (uint32_t)(i % 7), ORK_NPU_BO_INPUT, &tmp, &e) == ORK_OK;
            if (ok && i == 100) ok = ork_npu_bo_alloc(dev, 8192, ORK_NPU_BO_INPUT, &keep[1], &e) == ORK_OK;
            if (ok) ork_npu_bo_free(dev, &tmp);
        }
        CHECK(ok, "backend %d: address space not reused: %s", b, e.msg);
        ork_npu_bo_free(dev, &keep[0]);
        if (ok) ork_npu_bo_free(dev, &keep[1]);
        ork_npu_dev_close(dev);
        ork_fake_kernel_free(fk);
    }
}

/* No argument: every part. "address_reuse" runs only that part (it allocates
 * and zeroes 6.4 GB of buffers per backend: tens of seconds), "no_address_reuse"
 * all the others: tests/test_c_kernels.py runs the two halves as separate tests. */
int main(int argc, char **argv) {
    int reuse = 1, rest = 1;
    if (argc > 1 && !strcmp(argv[1], "address_reuse")) rest = 0;
    else if (argc > 1 && !strcmp(argv[1], "no_address_reuse")) reuse = 0;
    else if (argc > 1) {
        printf("usage: %s [address_reuse | no_address_reuse]\n", argv[0]);
        return 2;
    }
    if (rest) {
        printf("comparing npu emu and fake-kernel device backends against the reference\n");
        for (int rep = 0; rep < 20; rep++) pipeline();
        rknpu_contract();
        rocket_contract();
        discovery();
    }
    if (reuse) address_reuse();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail != 0;
}
