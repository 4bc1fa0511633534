#include "status.h"

#include <stdarg.h>
#include <stdio.h>

static const char *const ork_status_names[ORK_STATUS_COUNT] = {
    "ORK_OK",     "ORK_EINVAL", "ORK_ENONFINITE", "ORK_ENOMEM",  "ORK_ETHREAD",
    "ORK_EFORMAT", "ORK_EIO",   "ORK_ENOTIMPL",   "ORK_EUNAVAIL", "ORK_EGGUF",
    "ORK_ENPUUNAVAIL", "ORK_ENPU", "ORK_ETIMEDOUT", "ORK_ENPUCMD", "ORK_ESTATE",
};

const char *ork_status_name(ork_status st) {
    if ((int)st < 0 || st >= ORK_STATUS_COUNT) return "ORK_E?";
    return ork_status_names[st];
}

ork_status ork_err_set(ork_err *err, ork_status st, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return st;
}
