/* api/ws_chat.h — WS /ws/chat: a chat session over a WebSocket, for clients written against
 * that chat socket protocol. One conversation per connection, kept by the server while the
 * connection lives; every turn runs through api/generation.h like POST /v1/chat/completions.
 *
 * Frames (JSON text messages), server to client:
 *   {"type":"ready","model":ID,"vision":false,"audio":false,"transcription":false,
 *    "thinking":BOOL,"tools":BOOL,"genDefaults":{"temperature","top_p","top_k","max_tokens"}}
 *       once, first;
 *   {"type":"agent_start","id":"chatcmpl-…"} when a prompt's generation is submitted;
 *   {"type":"message_update","assistantMessageEvent":{"type":"thinking_delta"|"text_delta",
 *    "delta":TEXT}} as the reply streams; a tool call is
 *    {"type":"message_update","assistantMessageEvent":{"type":"toolcall","index":N,"id","name",
 *    "arguments"}} (id and name on a call's first piece);
 *   {"type":"agent_end","finish_reason":"stop"|"length"|"tool_calls"|"aborted","usage":
 *    {"prompt_tokens","completion_tokens","cached_tokens"},"timings":{"ttft_ms","tokens_per_s"}}
 *       when it is over (the assistant turn is then part of the conversation);
 *   {"type":"error","message":TEXT,"status":N} for a frame or a turn that failed.
 * Client to server:
 *   {"type":"prompt","message":TEXT, optional "system", "max_tokens", "temperature",
 *    "thinking":BOOL} a user turn;
 *   {"type":"abort"} cancels the turn under way (its generation is cancelled in the engine);
 *   {"type":"new_session"} forgets the conversation; answered {"type":"new_session"}. */
#ifndef INFERD_API_WS_CHAT_H
#define INFERD_API_WS_CHAT_H

#include "api/http.h"

/* GET /ws/chat: the upgrade (426 "expected websocket" without one), then the session. */
void ws_chat_handle(struct http_exchange *x);

#endif
