/* api/routes.h — the server's route table: every API's routes and the server's own, with how
 * each writes its errors. */
#ifndef INFERD_API_ROUTES_H
#define INFERD_API_ROUTES_H

#include "api/http.h"

/* The table `inferd serve` answers with (static; never freed). */
const struct http_routes *api_routes(void);

#endif
