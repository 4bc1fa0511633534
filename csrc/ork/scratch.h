/* scratch.h - scratch memory: a buffer on the caller's stack when the request fits, the heap
 * otherwise.
 *
 * A decoded token runs a few hundred small matmuls, each needing a few bytes to a few KB of
 * scratch (the quantized activation row, a strip's int32 sums, the RoPE table of a position).
 * Those come from a fixed buffer on the stack of the thread that uses them, so decoding a
 * token makes no heap allocation per linear (the session's own buffers are allocated once,
 * model.c). Bigger requests (a prefill's rows, very wide models) still go to malloc and may
 * fail, which the caller reports as ORK_ENOMEM as before. The buffer is only ever used by the
 * thread whose stack holds it.
 *
 *     _Alignas(64) unsigned char small[1024];
 *     int32_t *acc = ork_scratch(small, sizeof small, M * 32 * sizeof(int32_t));
 *     if (!acc) return ork_err_set(err, ORK_ENOMEM, ...);
 *     ...
 *     ork_scratch_free(acc, small);
 */
#ifndef ORK_SCRATCH_H
#define ORK_SCRATCH_H

#include <stddef.h>
#include <stdlib.h>

/* n bytes: `small` (small_len bytes) when n fits, else malloc(n) (NULL when that fails) */
static inline void *ork_scratch(void *small, size_t small_len, size_t n) { return n <= small_len ? small : malloc(n); }

/* release what ork_scratch returned for the same `small` (NULL is fine) */
static inline void ork_scratch_free(void *p, const void *small) {
    if (p != small) free(p);
}

#endif
