/* api/adapters.h — the LoRA adapter routes: GET /v1/adapters, GET /v1/adapters/available, POST /v1/adapters, DELETE /v1/adapters/{id}. */
#ifndef INFERD_API_ADAPTERS_H
#define INFERD_API_ADAPTERS_H

#include "api/http.h"

/* GET /v1/adapters and, with the id "available", GET /v1/adapters/available. */
void adapters_list(struct http_exchange *x);
void adapters_get(struct http_exchange *x);
/* POST /v1/adapters {id, path[, model]}: mounts (400 id and path required / validation
 * error, 409 id taken). */
void adapters_mount(struct http_exchange *x);
/* DELETE /v1/adapters/{id}: 404 adapter <id> not mounted, 409 while requests use it. */
void adapters_unmount(struct http_exchange *x);

#endif
