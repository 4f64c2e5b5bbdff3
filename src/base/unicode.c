/* unicode.c — UTF-8 helpers for the tokenizer (see unicode.h). The category
 * tables are in the generated unicode_tables.c. */
#include "base/unicode.h"

size_t unicode_code_points(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

size_t unicode_utf8_len(unsigned char b)
{
    static const unsigned char k_len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return k_len[b >> 4];
}

static bool is_cont(unsigned char b) { return (b & 0xC0) == 0x80; }

uint32_t unicode_decode_lenient(const char *str, size_t len, size_t *pos)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = *pos;
    unsigned char b0 = s[i];
    if (b0 < 0x80) {
        *pos = i + 1;
        return b0;
    }
    /* The checks mirror the reference decoder: the sequence length comes from
     * the lead byte, every continuation byte must be 10xxxxxx, and nothing
     * else (overlongs, surrogates, > U+10FFFF from F5..F7) is rejected. */
    if ((b0 & 0x40) == 0) goto bad;
    if ((b0 & 0x20) == 0) {
        if (i + 1 >= len || !is_cont(s[i + 1])) goto bad;
        *pos = i + 2;
        return ((uint32_t)(b0 & 0x1F) << 6) | (s[i + 1] & 0x3F);
    }
    if ((b0 & 0x10) == 0) {
        if (i + 2 >= len || !is_cont(s[i + 1]) || !is_cont(s[i + 2])) goto bad;
        *pos = i + 3;
        return ((uint32_t)(b0 & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
    }
    if ((b0 & 0x08) == 0) {
        if (i + 3 >= len || !is_cont(s[i + 1]) || !is_cont(s[i + 2]) || !is_cont(s[i + 3])) goto bad;
        *pos = i + 4;
        return ((uint32_t)(b0 & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12) |
               ((uint32_t)(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
    }
bad:
    *pos = i + 1;
    return UNICODE_REPLACEMENT;
}

size_t unicode_encode(uint32_t cpt, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cpt <= 0x7F) {
        o[0] = (unsigned char)cpt;
        return 1;
    }
    if (cpt <= 0x7FF) {
        o[0] = (unsigned char)(0xC0 | (cpt >> 6));
        o[1] = (unsigned char)(0x80 | (cpt & 0x3F));
        return 2;
    }
    if (cpt > 0x10FFFF) cpt = UNICODE_REPLACEMENT; /* the reference throws here; we substitute */
    if (cpt <= 0xFFFF) {
        o[0] = (unsigned char)(0xE0 | (cpt >> 12));
        o[1] = (unsigned char)(0x80 | ((cpt >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cpt & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cpt >> 18));
    o[1] = (unsigned char)(0x80 | ((cpt >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cpt >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cpt & 0x3F));
    return 4;
}
