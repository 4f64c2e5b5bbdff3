/* arch.c — the table of architecture descriptions (see arch.h). */
#include "model/arch.h"

#include <string.h>

static const struct arch_desc *const all[] = {&arch_llama, &arch_qwen2, &arch_qwen3, &arch_gemma2, &arch_gemma3};

const struct arch_desc *arch_find(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strlen(all[i]->name) == len && !memcmp(all[i]->name, name, len)) return all[i];
    return NULL;
}

const char *arch_names(void) { return "llama, qwen2, qwen3, gemma2, gemma3"; }
