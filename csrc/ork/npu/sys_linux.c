/* sys_linux.c - the real system-call table of the device backends: open,
 * ioctl (libdrm's drmIoctl, which restarts on EINTR/EAGAIN), mmap, the DRM
 * driver name (drmGetVersion) and node discovery (glob). Built with libdrm
 * when its headers are present (setup.py defines ORK_HAVE_LIBDRM); without
 * it the device backends report why they are unavailable. */
#include "backend.h"

#if defined(ORK_HAVE_LIBDRM) && defined(__linux__)
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <xf86drm.h>

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
    return drmIoctl(fd, request, arg) ? -errno : 0;
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
    drmVersionPtr v = drmGetVersion(fd);
    if (!v) return -(errno ? errno : ENOTTY);
    size_t n = (size_t)v->name_len < len - 1 ? (size_t)v->name_len : len - 1;
    memcpy(buf, v->name, n);
    buf[n] = 0;
    drmFreeVersion(v);
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
    if (why) *why = NULL;
    return &linux_sys;
}
#else
const ork_npu_sys *ork_npu_sys_linux(const char **why) {
    if (why) *why = "orkpy was built without libdrm (install libdrm-dev and rebuild)";
    return NULL;
}
#endif
