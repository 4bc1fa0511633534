/* sys_linux.c - the real system-call table of the device backends: open,
 * ioctl (libdrm's drmIoctl, which restarts on EINTR/EAGAIN), mmap, the DRM
 * driver name (drmGetVersion) and node discovery (glob).
 *
 * libdrm is loaded with dlopen when a device backend is first opened or
 * probed, never linked: the build needs neither libdrm-dev nor libdrm, and
 * CPU-only use never loads it. Without libdrm.so.2 the device backends
 * report that as the reason they are unavailable. ORKPY_LIBDRM names another
 * library file (an unusual install; the tests use it). */
#include "backend.h"

#if defined(__linux__)
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* The leading fields of libdrm's drmVersion (xf86drm.h; unchanged since libdrm 2.0). */
typedef struct {
    int version_major, version_minor, version_patchlevel;
    int name_len;
    char *name;
    int date_len;
    char *date;
    int desc_len;
    char *desc;
} drm_version;

static struct {
    int (*ioctl)(int fd, unsigned long request, void *arg);
    drm_version *(*get_version)(int fd);
    void (*free_version)(drm_version *v);
    char why[160]; /* "" once loaded */
} drm;
static pthread_once_t drm_once = PTHREAD_ONCE_INIT;

static void drm_load(void) {
    const char *file = getenv("ORKPY_LIBDRM");
    if (!file || !*file) file = "libdrm.so.2";
    void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(drm.why, sizeof drm.why, "%s not found (install libdrm2): %s", file, e ? e : "dlopen failed");
        return;
    }
    drm.ioctl = (int (*)(int, unsigned long, void *))dlsym(h, "drmIoctl");
    drm.get_version = (drm_version *(*)(int))dlsym(h, "drmGetVersion");
    drm.free_version = (void (*)(drm_version *))dlsym(h, "drmFreeVersion");
    if (!drm.ioctl || !drm.get_version || !drm.free_version) {
        snprintf(drm.why, sizeof drm.why, "%s lacks drmIoctl/drmGetVersion/drmFreeVersion: not libdrm?", file);
        dlclose(h);
    }
}

static int l_open(void *ctx, const char *path) {
    (void)ctx;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    return fd < 0 ? -errno : fd;
}
static int l_close(void *ctx, int fd) {
    (void)ctx;
    return close(fd) ? -errno : 0;
}
static int l_ioctl(void *ctx, int fd, unsigned long request, void *arg) {
    (void)ctx;
    return drm.ioctl(fd, request, arg) ? -errno : 0;
}
static void *l_mmap(void *ctx, size_t len, int fd, uint64_t offset, int *err_no) {
    (void)ctx;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)offset);
    if (p == MAP_FAILED) {
        *err_no = errno;
        return NULL;
    }
    return p;
}
static int l_munmap(void *ctx, void *p, size_t len) {
    (void)ctx;
    return munmap(p, len) ? -errno : 0;
}
static int l_driver_name(void *ctx, int fd, char *buf, size_t len) {
    (void)ctx;
    drm_version *v = drm.get_version(fd);
    if (!v) return -(errno ? errno : ENOTTY);
    size_t n = (size_t)v->name_len < len - 1 ? (size_t)v->name_len : len - 1;
    memcpy(buf, v->name, n);
    buf[n] = 0;
    drm.free_version(v);
    return 0;
}
static int l_list(void *ctx, const char *pattern, char (*paths)[64], int max) {
    (void)ctx;
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc == GLOB_NOMATCH) return 0;
    if (rc) return -EIO;
    int n = 0;
    for (size_t i = 0; i < g.gl_pathc && n < max; i++) {
        if (strlen(g.gl_pathv[i]) >= 64) continue;
        strcpy(paths[n++], g.gl_pathv[i]);
    }
    globfree(&g);
    return n;
}
static int64_t l_now(void *ctx) {
    (void)ctx;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static const ork_npu_sys linux_sys = {NULL, "linux", l_open, l_close, l_ioctl, l_mmap, l_munmap, l_driver_name, l_list, l_now, NULL};

const ork_npu_sys *ork_npu_sys_linux(const char **why) {
    pthread_once(&drm_once, drm_load);
    if (why) *why = drm.why[0] ? drm.why : NULL;
    return drm.why[0] ? NULL : &linux_sys;
}
#else
const ork_npu_sys *ork_npu_sys_linux(const char **why) {
    if (why) *why = "the NPU device backends need Linux";
    return NULL;
}
#endif
