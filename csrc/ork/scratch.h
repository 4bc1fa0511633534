/* scratch.h - scratch memory: a typed buffer on the caller's stack when the request fits, the
 * heap otherwise.
 *
 * A decoded token runs a few hundred small matmuls, each needing a few bytes to a few KB of
 * scratch (the quantized activation row, a strip's int32 sums, the RoPE table of a position).
 * Those come from a fixed buffer on the stack of the function that needs them (declared with
 * the element type it is used as), so decoding a token of a model of ordinary width makes no
 * heap allocation per linear (the session's own buffers are allocated once, model.c). Requests
 * larger than the buffer (a prefill's rows, wide rows, many groups) go to malloc and may fail,
 * which the caller reports as ORK_ENOMEM as before. The buffer lives until its function
 * returns: it may be handed to work that ends before that (ork_parallel_for joins its
 * threads), never kept.
 *
 * Under AddressSanitizer every request goes to malloc, so an overrun of the requested size is
 * still caught (a stack buffer larger than the request would hide it).
 *
 *     _Alignas(64) int32_t acc_s[256];
 *     int32_t *acc = ork_scratch(acc_s, sizeof acc_s, M * 32 * sizeof(int32_t));
 *     if (!acc) return ork_err_set(err, ORK_ENOMEM, ...);
 *     ...
 *     ork_scratch_free(acc, acc_s);
 */
#ifndef ORK_SCRATCH_H
#define ORK_SCRATCH_H

#include <stddef.h>
#include <stdlib.h>

#if defined(__SANITIZE_ADDRESS__)
#define ORK_SCRATCH_HEAP_ONLY 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ORK_SCRATCH_HEAP_ONLY 1
#endif
#endif

/* n bytes: `small` (small_len bytes) when n fits, else malloc(n) (NULL when that fails) */
static inline void *ork_scratch(void *small, size_t small_len, size_t n) {
#ifdef ORK_SCRATCH_HEAP_ONLY
    (void)small;
    (void)small_len;
    return malloc(n ? n : 1);
#else
    return n <= small_len ? small : malloc(n);
#endif
}

/* release what ork_scratch returned for the same `small` (NULL is fine) */
static inline void ork_scratch_free(void *p, const void *small) {
    if (p != small) free(p);
}

#endif
