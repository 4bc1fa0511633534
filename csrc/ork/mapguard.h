/* mapguard.h - read-only file mappings that survive their file shrinking.
 *
 * Reading a page of a MAP_SHARED mapping that lies past the file's current
 * end raises SIGBUS, whose default action kills the process: another process
 * truncating a file orkpy has mapped (a partial copy, an rsync, a re-export in
 * place) would take orkpy down with no exception and no clean-up.
 *
 * ork_mapped_open maps a whole regular file read-only and registers the
 * mapping with a process-wide SIGBUS handler, installed once, on the first
 * mapping, over the handler that was there before (which it keeps):
 *
 *   - a fault (si_code > 0) at an address inside a registered mapping
 *     replaces the pages from the faulting one to the end of that mapping by
 *     anonymous zero pages (mmap MAP_FIXED) and marks the mapping as faulted;
 *     the faulting read resumes and reads zeros;
 *   - any other SIGBUS goes to the previous handler: called if it is a
 *     function, else the default action is restored and the signal takes it
 *     (a fault re-executes and dies as before, a sent signal is re-raised).
 *
 * ork_mapped_check says whether the file still has the size and modification
 * time it had at open and whether a read of the mapping faulted. Callers
 * check before and after each operation that reads mapped data and discard
 * the result of an operation that overlapped a change: the handler only
 * turns a crash into a detectable, sticky state.
 *
 * The handler is async-signal-safe: it reads the registry through per-slot
 * sequence counters (lock-free atomics) and calls only mmap, sigaction and
 * raise. A mapping is registered before its pointer is handed out and
 * unregistered only by ork_mapped_close, when nothing reads it any more, so
 * the slot of a faulting read is always stable. At most ORK_MAPGUARD_SLOTS
 * mappings are open at once. A SIGBUS handler installed later by someone else
 * that does not chain to the one it replaced disables the recovery (the
 * size check still applies).
 */
#ifndef ORK_MAPGUARD_H
#define ORK_MAPGUARD_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define ORK_MAPGUARD_SLOTS 4096

typedef struct ork_mapped {
    const uint8_t *data; /* the mapping; NULL for an empty file */
    size_t size;         /* file size at open (bytes mapped) */
    int fd;              /* kept open for fstat; -1 when closed */
    int slot;            /* registry slot, -1 when not registered */
    int64_t mtime_sec, mtime_nsec;
} ork_mapped;

/* Open and map `path` read-only. On ORK_EIO *os_errno is the errno (ENOENT,
 * EACCES, EISDIR, EINVAL for a file that is not regular, ...), else 0. */
ork_status ork_mapped_open(const char *path, ork_mapped *m, int *os_errno, ork_err *err);

/* The same for a file already open for reading: `fd` is taken over (kept for the checks, closed
 * by ork_mapped_close, or here on an error). Whoever opened it chose the file: a loader that
 * verifies bytes and then uses them maps the descriptor it verified (openat relative to one
 * directory descriptor, orkpy/formats/modeldir.py). */
ork_status ork_mapped_open_fd(int fd, ork_mapped *m, int *os_errno, ork_err *err);

/* ORK_OK while the file is unchanged; ORK_EFORMAT naming the change
 * ("changed size while mapped: was N bytes, now M", a fault, a new
 * modification time); ORK_EIO if fstat fails; ORK_EINVAL when closed. */
ork_status ork_mapped_check(const ork_mapped *m, ork_err *err);

/* 1 once a read of the mapping faulted past the file's end (sticky). */
int ork_mapped_faulted(const ork_mapped *m);

/* Drop the resident pages of bytes [offset, offset + length) of the mapping from this process
 * (madvise MADV_DONTNEED, widened to whole pages; the range is clipped to the file): the next read
 * pages them in from the file again, so what is read never changes; the page cache keeps them.
 * Streaming readers call it after each tensor so that the resident set does not grow with the
 * file. ORK_EINVAL when closed; ORK_EIO if madvise fails. */
ork_status ork_mapped_release(const ork_mapped *m, size_t offset, size_t length, ork_err *err);

/* Unregister, unmap and close; safe to call twice. */
void ork_mapped_close(ork_mapped *m);

/* For tests: whether the handler is installed, and live registered mappings. */
void ork_mapguard_state(int *installed, int *live);

#endif
