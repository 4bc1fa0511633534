/* o4n1.h - the persisted packed-weight formats 'O4N1' (4-bit kinds) and
 * 'O8N1' (int8). Byte-for-byte spec: docs/o4n1.md. All little-endian.
 * Versions: 1 per-channel float32 scales (written for per-channel weights),
 * 2 grouped float32 scales (read, no longer written), 3 grouped float16 scales
 * (written for group-wise weights), 4 grouped float16 scales and offsets (affine groups).
 *
 *   0   4  magic 'O4N1' | 'O8N1'
 *   4   4  u32 version = 1
 *   8   4  u32 kind: the kind's registry id (quant.h): 0 nf4, 1 int4 (O4N1); 2 int8, 3 int5,
 *          4 int6 (O8N1)
 *   12  4  u32 header bytes = 64 (where bscale starts)
 *   16  8  u64 K (inputs)
 *   24  8  u64 N (outputs)
 *   32 16  int8 lut[16]: the kind's LUT (O4N1), all zero (O8N1)
 *   48  8  u64 store offset = round_up(64 + 4*N, 64)
 *   56  8  u64 store bytes  = Np*Kp/2 (O4N1), Np*Kp (O8N1 int8), Np*Kp*b/8 (O8N1 int6 b = 6,
 *          int5 b = 5: the tile store as a bit stream, pack.h "Narrow file stores")
 *   64 4N  f32 bscale[N], finite, >= +0 and <= ork_pack_max_scale(K) (pack.h)
 *   ..     zero bytes up to the store offset
 *   store offset: the tile store of pack.h; the file ends right after it.
 *
 *
 * Version 2 (group-wise scales, pack.h "Group-wise scales"; only for a group
 * size g < K, so per-channel files stay version 1 byte for byte): the same
 * fields with version = 2 and header bytes = 72, then
 *   64  4  u32 group size g: a multiple of 32 in [32, 4096], g < K
 *   68  4  u32 G = ceil(K / g), scales per output
 *   72 4NG f32 bscale[N][G] (row-major), each bounded as above
 *   store offset = round_up(72 + 4*N*G, 64)
 * Version 3 (what is written for a group size g < K): version 2 with version = 3
 * and the scales as IEEE float16 (quant.h "float16 group scales"):
 *   72 2NG f16 bscale[N][G] (u16 little-endian bit patterns), finite, >= +0
 *          (not -0), bounded as above once widened to float32 (exactly, half.h)
 *   store offset = round_up(72 + 2*N*G, 64)
 * Version 4 (affine groups, affine.h: written for a group-wise w4a4 / w4a8 weight with
 * offsets): version 3 with version = 4, the offsets after the scales:
 *   72        2NG f16 bscale[N][G], as in version 3
 *   72 + 2NG  2NG f16 boffset[N][G] (u16 little-endian), finite (any sign)
 *   store offset = round_up(72 + 4*N*G, 64); only kinds that take affine groups.
 *
 * ork_o4n1_parse checks every field against the others and the buffer length
 * (and every scale, every int8 code of an O8N1 store: no -128, and every
 * padding lane of the store: the zero code, pack.h ork_pack_check_padding) and
 * returns ORK_EFORMAT naming the first problem. Never reads out of bounds.
 */
#ifndef ORK_O4N1_H
#define ORK_O4N1_H

#include <stddef.h>
#include <stdint.h>

#include "quant.h"
#include "status.h"

#define ORK_O4N1_VERSION 1
#define ORK_O4N1_HEADER 64
#define ORK_O4N1_VERSION_GROUPED 2 /* float32 group scales: read only */
#define ORK_O4N1_VERSION_F16 3     /* float16 group scales: written for grouped weights */
#define ORK_O4N1_VERSION_AFFINE 4  /* float16 group scales and offsets: written for affine groups */
#define ORK_O4N1_HEADER_GROUPED 72

typedef struct ork_o4n1_info {
    ork_kind kind;
    uint64_t K, N;
    uint64_t scales_off, store_off, store_bytes;
    uint64_t group, G; /* 0 and 1 for a version-1 (per-channel) file */
    uint32_t version;     /* 1, 2, 3 or 4 */
    uint32_t scale_bytes; /* 4 (float32 scales, versions 1 and 2) or 2 (float16, versions 3 and 4) */
    uint64_t offsets_off; /* version 4: where the float16 offsets start; 0 without */
} ork_o4n1_info;

/* The store offset of a file with N outputs: round_up(64 + 4*N, 64). */
uint64_t ork_o4n1_store_offset(uint64_t N);
/* "O4N1" for 4-bit kinds, "O8N1" for 8-bit kinds, NULL for unknown kinds. */
const char *ork_o4n1_magic(ork_kind kind);
/* The store offset of the file written for a group size (0 or >= K: per channel,
 * version 1; else version 3, float16 scales; affine: version 4, scales and offsets). */
uint64_t ork_o4n1_grouped_store_offset(uint64_t N, uint64_t K, uint64_t group, int affine);
/* The header for a weight: 64 bytes (version 1) when group is 0 or >= K, else 72
 * (version 3: the scales follow as float16; version 4 with `affine`: then the offsets);
 * *hdr_bytes says which. Store offset/bytes derived. Version 2 is never written.
 * affine needs a kind and group that take affine groups (ork_affine_check). */
ork_status ork_o4n1_header(ork_kind kind, uint64_t N, uint64_t K, uint64_t group, int affine,
                           uint8_t hdr[ORK_O4N1_HEADER_GROUPED], size_t *hdr_bytes, ork_err *err);
ork_status ork_o4n1_parse(const uint8_t *buf, size_t len, ork_o4n1_info *info, ork_err *err);

#endif
