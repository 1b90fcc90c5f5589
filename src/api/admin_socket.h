/* api/admin_socket.h — serve --isolate's unix socket for local jobs that share the machine:
 * POST /admin/drain (every resident model's cached prefixes made durable in its SSD tier) and
 * POST /admin/lease (exclusive use of the device while the response stays open: every engine
 * child is paused). Plain HTTP/1.1, one request a connection, no API key: the socket's mode
 * (0600, the server's user) is the gate. */
#ifndef INFERD_API_ADMIN_SOCKET_H
#define INFERD_API_ADMIN_SOCKET_H

#include <stdint.h>

#include "api/server.h"
#include "base/err.h"

/* POST /admin/drain's work, also usable without the socket: flushes every resident model's
 * prefix cache to its SSD tier; returns the cached blocks now durable there (0 for models
 * without a tier). */
uint64_t admin_drain(struct server *srv);

struct admin_socket;

/* Listens on path (a stale socket file there is replaced) and answers on a thread of its own;
 * srv->isolation must be set (the lease pauses its children). */
int admin_socket_start(struct server *srv, const char *path, struct admin_socket **out,
                       struct err *err);
/* Closes the socket and every open connection (leases end), waits for their threads, and
 * removes the socket file. NULL is ignored. */
void admin_socket_stop(struct admin_socket *a);

#endif
