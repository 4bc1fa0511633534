/* status.h - status codes returned by every orkpy core function.
 *
 * Contract: a core function never prints, never aborts and never exits. It
 * returns an ork_status; on failure it may fill a caller-provided ork_err with
 * a human-readable message (the binding layer turns status + message into one
 * Python exception through a single table, csrc/py/errors.c).
 */
#ifndef ORK_STATUS_H
#define ORK_STATUS_H

#include <stddef.h>

typedef enum ork_status {
    ORK_OK = 0,
    ORK_EINVAL = 1,      /* bad argument (shape, kind, range) -> ValueError     */
    ORK_ENONFINITE = 2,  /* NaN or Inf where a finite value is required         */
    ORK_ENOMEM = 3,      /* allocation failed -> MemoryError                    */
    ORK_ETHREAD = 4,     /* could not start a worker thread -> RuntimeError     */
    ORK_EFORMAT = 5,     /* malformed persisted file -> orkpy.FormatError       */
    ORK_EIO = 6,         /* operating-system I/O error -> OSError               */
    ORK_ENOTIMPL = 7,    /* valid request that orkpy does not implement         */
    ORK_EUNAVAIL = 8,    /* requested CPU kernel / device not present here      */
    ORK_EGGUF = 9,       /* malformed GGUF file -> orkpy.GGUFError              */
    ORK_ENPUUNAVAIL = 10, /* NPU backend not usable here -> orkpy.NPUUnavailableError */
    ORK_ENPU = 11,       /* NPU driver / device call failed -> orkpy.NPUError   */
    ORK_ETIMEDOUT = 12,  /* NPU job did not finish in time -> orkpy.NPUTimeoutError */
    ORK_ENPUCMD = 13,    /* command stream or driver contract the emulator / fake
                            kernel does not accept -> orkpy.NPUCommandError    */
    ORK_ESTATE = 14,     /* call out of order (a collection taken that was never
                            enabled) -> RuntimeError                           */
    ORK_STATUS_COUNT
} ork_status;

/* Optional error detail. Functions take `ork_err *err` which may be NULL. */
typedef struct ork_err {
    char msg[256];
} ork_err;

/* Short, static name of a status ("ORK_EINVAL", ...). Never NULL. */
const char *ork_status_name(ork_status st);

/* printf-style setter; does nothing when err is NULL. Returns st. */
ork_status ork_err_set(ork_err *err, ork_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#endif /* ORK_STATUS_H */
