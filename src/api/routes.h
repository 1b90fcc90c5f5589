/* api/routes.h — the server's route table: every API's routes and the server's own, with how
 * each writes its errors. */
#ifndef INFERD_API_ROUTES_H
#define INFERD_API_ROUTES_H

#include "api/http.h"

#include <stdbool.h>

/* The table `inferd serve` answers with (static; never freed); webui false leaves out the chat
 * page's routes (--no-webui). */
const struct http_routes *api_routes(bool webui);

#endif
