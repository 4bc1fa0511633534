/* mapguard.c - see mapguard.h. */
#include "mapguard.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    atomic_uint seq;     /* odd while a writer updates start/len */
    atomic_uintptr_t start;
    atomic_size_t len;   /* 0: free */
    atomic_int faulted;
} guard_slot;

static guard_slot slots[ORK_MAPGUARD_SLOTS];
static unsigned char slot_used[ORK_MAPGUARD_SLOTS]; /* under reg_lock */
static atomic_int high_water;                        /* slots[0 .. high_water) may be live */
static int live_count;                               /* under reg_lock */
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction prev_action;
static atomic_int installed;
static uintptr_t page_size;

static void chain(int sig, siginfo_t *si, void *uc) {
    struct sigaction p = prev_action;
    if (p.sa_flags & SA_SIGINFO) {
        if (p.sa_sigaction) {
            p.sa_sigaction(sig, si, uc);
            return;
        }
    } else if (p.sa_handler == SIG_IGN) {
        if (!si || si->si_code <= 0) return; /* a sent SIGBUS stays ignored */
    } else if (p.sa_handler != SIG_DFL) {
        p.sa_handler(sig);
        return;
    }
    /* the default action: a fault re-executes the instruction and dies; a sent
     * signal is re-raised (blocked until this handler returns) */
    struct sigaction d;
    memset(&d, 0, sizeof d);
    d.sa_handler = SIG_DFL;
    sigemptyset(&d.sa_mask);
    sigaction(sig, &d, NULL);
    if (!si || si->si_code <= 0) raise(sig);
}

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    int saved_errno = errno;
    if (si && si->si_code > 0) {
        uintptr_t a = (uintptr_t)si->si_addr;
        int hw = atomic_load(&high_water);
        for (int i = 0; i < hw; i++) {
            guard_slot *s = &slots[i];
            unsigned q = atomic_load(&s->seq);
            if (q & 1) continue; /* being (un)registered: not a mapping anyone reads */
            uintptr_t start = atomic_load(&s->start);
            size_t len = atomic_load(&s->len);
            if (atomic_load(&s->seq) != q || len == 0 || a < start || a - start >= len) continue;
            uintptr_t page = a & ~(page_size - 1);
            uintptr_t end = (start + len + page_size - 1) & ~(page_size - 1);
            void *r = mmap((void *)page, (size_t)(end - page), PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                           -1, 0);
            if (r != MAP_FAILED) {
                atomic_store(&s->faulted, 1);
                errno = saved_errno;
                return;
            }
            break;
        }
    }
    chain(sig, si, uc);
    errno = saved_errno;
}

/* under reg_lock */
static ork_status install(ork_err *err) {
    if (atomic_load(&installed)) return ORK_OK;
    long ps = sysconf(_SC_PAGESIZE);
    page_size = ps > 0 ? (uintptr_t)ps : 4096;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &prev_action) != 0)
        return ork_err_set(err, ORK_EIO, "cannot install the SIGBUS guard: %s", strerror(errno));
    atomic_store(&installed, 1);
    return ORK_OK;
}

static ork_status slot_register(uintptr_t start, size_t len, int *out, ork_err *err) {
    int idx = -1;
    pthread_mutex_lock(&reg_lock);
    ork_status st = install(err);
    if (st == ORK_OK) {
        for (int i = 0; i < ORK_MAPGUARD_SLOTS; i++)
            if (!slot_used[i]) {
                idx = i;
                break;
            }
        if (idx < 0) st = ork_err_set(err, ORK_ENOMEM, "more than %d files mapped at once", ORK_MAPGUARD_SLOTS);
    }
    if (idx >= 0) {
        guard_slot *s = &slots[idx];
        slot_used[idx] = 1;
        live_count++;
        atomic_fetch_add(&s->seq, 1);
        atomic_store(&s->start, start);
        atomic_store(&s->len, len);
        atomic_store(&s->faulted, 0);
        atomic_fetch_add(&s->seq, 1);
        if (idx >= atomic_load(&high_water)) atomic_store(&high_water, idx + 1);
    }
    pthread_mutex_unlock(&reg_lock);
    *out = idx;
    return st;
}

static void slot_release(int idx) {
    pthread_mutex_lock(&reg_lock);
    guard_slot *s = &slots[idx];
    atomic_fetch_add(&s->seq, 1);
    atomic_store(&s->len, 0);
    atomic_store(&s->start, 0);
    atomic_fetch_add(&s->seq, 1);
    slot_used[idx] = 0;
    live_count--;
    pthread_mutex_unlock(&reg_lock);
}

ork_status ork_mapped_open(const char *path, ork_mapped *m, int *os_errno, ork_err *err) {
    if (os_errno) *os_errno = 0;
    if (!path || !m) return ork_err_set(err, ORK_EINVAL, "mapped_open: NULL argument");
    /* O_NONBLOCK: opening a FIFO must not hang before fstat refuses it */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        memset(m, 0, sizeof *m);
        m->fd = -1;
        m->slot = -1;
        if (os_errno) *os_errno = e;
        return ork_err_set(err, ORK_EIO, "%s", strerror(e));
    }
    return ork_mapped_open_fd(fd, m, os_errno, err);
}

ork_status ork_mapped_open_fd(int fd, ork_mapped *m, int *os_errno, ork_err *err) {
    if (os_errno) *os_errno = 0;
    if (!m) {
        if (fd >= 0) close(fd);
        return ork_err_set(err, ORK_EINVAL, "mapped_open: NULL argument");
    }
    memset(m, 0, sizeof *m);
    m->fd = -1;
    m->slot = -1;
    if (fd < 0) return ork_err_set(err, ORK_EINVAL, "mapped_open: no file descriptor");
    int e = 0;
    struct stat sb;
    if (fstat(fd, &sb) != 0) e = errno;
    else if (S_ISDIR(sb.st_mode)) e = EISDIR;
    else if (!S_ISREG(sb.st_mode)) e = EINVAL;
    else if ((uint64_t)sb.st_size > (uint64_t)SIZE_MAX) e = EFBIG;
    if (e) {
        close(fd);
        if (os_errno) *os_errno = e;
        return ork_err_set(err, ORK_EIO, "%s", e == EINVAL ? "not a regular file" : strerror(e));
    }
    size_t size = (size_t)sb.st_size;
    if (size > 0) {
        void *p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            e = errno;
            close(fd);
            if (os_errno) *os_errno = e;
            return ork_err_set(err, ORK_EIO, "cannot map: %s", strerror(e));
        }
        int slot = -1;
        ork_status st = slot_register((uintptr_t)p, size, &slot, err);
        if (st != ORK_OK) {
            munmap(p, size);
            close(fd);
            return st;
        }
        m->data = (const uint8_t *)p;
        m->slot = slot;
    }
    m->fd = fd;
    m->size = size;
    m->mtime_sec = (int64_t)sb.st_mtim.tv_sec;
    m->mtime_nsec = (int64_t)sb.st_mtim.tv_nsec;
    return ORK_OK;
}

int ork_mapped_faulted(const ork_mapped *m) {
    return m && m->slot >= 0 && atomic_load(&slots[m->slot].faulted) != 0;
}

ork_status ork_mapped_check(const ork_mapped *m, ork_err *err) {
    if (!m || m->fd < 0) return ork_err_set(err, ORK_EINVAL, "the mapping is closed");
    struct stat sb;
    if (fstat(m->fd, &sb) != 0) {
        int e = errno;
        ork_err_set(err, ORK_EIO, "fstat: %s", strerror(e));
        errno = e; /* for the caller's OSError */
        return ORK_EIO;
    }
    if ((uint64_t)sb.st_size != (uint64_t)m->size)
        return ork_err_set(err, ORK_EFORMAT, "changed size while mapped: was %zu bytes, now %lld", m->size,
                           (long long)sb.st_size);
    if (ork_mapped_faulted(m))
        return ork_err_set(err, ORK_EFORMAT, "shrank while mapped (a read past its end got zeros); it is %zu bytes again "
                           "but its contents are not the ones opened", m->size);
    if ((int64_t)sb.st_mtim.tv_sec != m->mtime_sec || (int64_t)sb.st_mtim.tv_nsec != m->mtime_nsec)
        return ork_err_set(err, ORK_EFORMAT, "was modified while mapped (same size, %zu bytes, new modification time)",
                           m->size);
    return ORK_OK;
}

ork_status ork_mapped_release(const ork_mapped *m, size_t offset, size_t length, ork_err *err) {
    if (!m || m->fd < 0) return ork_err_set(err, ORK_EINVAL, "release: the file is closed");
    if (!m->data || offset >= m->size || length == 0) return ORK_OK;
    if (length > m->size - offset) length = m->size - offset;
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = ((uintptr_t)m->data + offset) & ~(pg - 1);
    const uintptr_t b = ((uintptr_t)m->data + offset + length + pg - 1) & ~(pg - 1);
    if (madvise((void *)a, (size_t)(b - a), MADV_DONTNEED) != 0)
        return ork_err_set(err, ORK_EIO, "release: madvise failed: %s", strerror(errno));
    return ORK_OK;
}

void ork_mapped_close(ork_mapped *m) {
    if (!m) return;
    if (m->slot >= 0) slot_release(m->slot);
    if (m->data) munmap((void *)m->data, m->size);
    if (m->fd >= 0) close(m->fd);
    m->data = NULL;
    m->slot = -1;
    m->fd = -1;
}

void ork_mapguard_state(int *is_installed, int *live) {
    pthread_mutex_lock(&reg_lock);
    if (is_installed) *is_installed = atomic_load(&installed);
    if (live) *live = live_count;
    pthread_mutex_unlock(&reg_lock);
}
