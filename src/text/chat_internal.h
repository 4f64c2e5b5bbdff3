/* chat_internal.h — between chat.c (the built-in families) and
 * chat_render.c (the entry that also runs Jinja templates). */
#ifndef KVB_CHAT_INTERNAL_H
#define KVB_CHAT_INTERNAL_H

#include "text/chat.h"

/* A built-in family's text for msgs with the spans of the contents in it;
 * continue_final cuts it after the final (assistant's) message. */
enum kvb_status chat_builtin_render(const struct chat_template *t, const struct chat_msg *msgs, size_t n,
                                    bool add_generation_prompt, bool continue_final, struct jinja_output *out,
                                    struct kvb_err *err);

#endif
