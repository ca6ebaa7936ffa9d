#include <string.h>

#include "rk_base.h"

/* Block layouts (bytes): q4_0 = f16 d + 16 nibble bytes; q4_1 = f16 d, f16 m + 16;
 * q8_0 = f16 d + 32 int8; q8_1 = f16 d, f16 s + 32; q4_K = f16 d, dmin, 12 scale
 * bytes, 128 nibble bytes; q6_K = 128 ql + 64 qh + 16 int8 scales + f16 d;
 * q8_K = f32 d + 256 int8 + 16 int16 bsums. */
static const rk_dtype_traits traits[] = {
    [RK_DT_F32] = {"f32", 1, 4, true},        [RK_DT_F16] = {"f16", 1, 2, true},
    [RK_DT_Q4_0] = {"q4_0", 32, 18, true},    [RK_DT_Q4_1] = {"q4_1", 32, 20, true},
    [RK_DT_Q8_0] = {"q8_0", 32, 34, true},    [RK_DT_Q8_1] = {"q8_1", 32, 36, false},
    [RK_DT_Q4_K] = {"q4_K", 256, 144, true},  [RK_DT_Q6_K] = {"q6_K", 256, 210, true},
    [RK_DT_Q8_K] = {"q8_K", 256, 292, false}, [RK_DT_BF16] = {"bf16", 1, 2, true},
};

const rk_dtype_traits *rk_dtype_get(uint32_t type) {
    if (type >= sizeof traits / sizeof traits[0] || !traits[type].name) return NULL;
    return &traits[type];
}

const char *rk_dtype_name(uint32_t type) {
    const rk_dtype_traits *t = rk_dtype_get(type);
    return t ? t->name : "unknown";
}

bool rk_dtype_row_bytes(uint32_t type, uint64_t n, uint64_t *out) {
    const rk_dtype_traits *t = rk_dtype_get(type);
    if (!t || n % t->blck_size) return false;
    return rk_mul_u64(n / t->blck_size, t->type_size, out);
}

float rk_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t rk_f32_to_f16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
    if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow -> inf */
    if (abs < 0x38800000u) {                                   /* result is subnormal or zero */
        if (abs < 0x33000000u) return (uint16_t)sign;          /* below half the smallest subnormal */
        uint32_t e = abs >> 23;
        uint32_t m = (abs & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = abs - 0x38000000u; /* rebias exponent */
    uint32_t q = r >> 13;
    uint32_t rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}
