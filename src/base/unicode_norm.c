/* unicode_norm.c — canonical decomposition, lowercase and nonspacing marks,
 * by binary search over generated tables (unicode_norm_tables.c; see
 * unicode.h). */
#include <stddef.h>

#include "base/unicode.h"
#include "base/unicode_norm_tables.h"

/* Index of the row whose first column is cpt in a table of n rows of
 * `width` entries, or -1. */
static int64_t find(const uint32_t *rows, uint32_t n, size_t width, uint32_t cpt)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2, key = rows[(size_t)mid * width];
        if (key == cpt) return mid;
        if (key < cpt) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

size_t unicode_nfd(uint32_t cpt, uint32_t out[UNICODE_NFD_MAX])
{
    /* Hangul syllables: L V (T), Unicode's chapter 3.12 */
    if (cpt >= 0xAC00 && cpt <= 0xD7A3) {
        const uint32_t s = cpt - 0xAC00, t = s % 28;
        out[0] = 0x1100 + s / (21 * 28);
        out[1] = 0x1161 + (s % (21 * 28)) / 28;
        if (!t) return 2;
        out[2] = 0x11A7 + t;
        return 3;
    }
    const int64_t i = find(&unicode_nfd_table[0][0], unicode_nfd_count, 5, cpt);
    if (i < 0) {
        out[0] = cpt;
        return 1;
    }
    size_t n = 0;
    while (n < UNICODE_NFD_MAX && unicode_nfd_table[i][1 + n]) {
        out[n] = unicode_nfd_table[i][1 + n];
        n++;
    }
    return n;
}

size_t unicode_lower(uint32_t cpt, uint32_t out[2])
{
    const int64_t i = cpt < 0x41 ? -1 : find(&unicode_lower_table[0][0], unicode_lower_count, 3, cpt);
    if (i < 0) {
        out[0] = cpt;
        return 1;
    }
    out[0] = unicode_lower_table[i][1];
    if (!unicode_lower_table[i][2]) return 1;
    out[1] = unicode_lower_table[i][2];
    return 2;
}

bool unicode_is_mn(uint32_t cpt)
{
    uint32_t lo = 0, hi = unicode_mn_count;
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (cpt < unicode_mn_ranges[mid][0]) hi = mid;
        else if (cpt > unicode_mn_ranges[mid][1]) lo = mid + 1;
        else return true;
    }
    return false;
}
