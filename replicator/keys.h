/*
 * keys.h — CURVE keys: who may talk to whom, and encryption of all traffic.
 *
 * A key directory (made by `hwfs keygen DIR`) holds:
 *   DIR/key              this process's key pair: public and secret, Z85, one per line (0600)
 *   DIR/key.pub          the public key alone, to hand to the others
 *   DIR/authorized/NAME.pub  the public keys allowed to connect (coordinator and nodes)
 *   DIR/coordinator.pub  (nodes) the coordinator's public key
 * With keys, every server socket (the coordinator's ROUTER, each node's data
 * ROUTER) is a CURVE server whose ZAP handler admits only authorized keys, and
 * every client socket is a CURVE client that knows its server's key (a donor's
 * key comes with the coordinator's plan, over the authenticated channel).
 */
#ifndef HWFS_KEYS_H
#define HWFS_KEYS_H

#include "hwfs_common.h"

#define KEY_Z85 41 /* 40 characters + NUL */

struct keys;

/** Create DIR (0700) with a new key pair, DIR/authorized/ holding its own public key. */
int keys_generate(const char *dir, char pub[KEY_Z85]);

/** Load DIR (see above). Returns 0, -ENOENT (no DIR/key), -EINVAL (malformed key). */
int keys_load(const char *dir, struct keys **out);

/** This process's public key (Z85). */
const char *keys_public(const struct keys *k);

/** The coordinator's public key from DIR/coordinator.pub, or NULL. */
const char *keys_coordinator(const struct keys *k);

/**
 * keys_start_zap() - serve ZAP (the authentication handler) for every CURVE
 * server socket of zmq context @ctx: admit authorized keys, refuse the rest
 * (logged). Call before binding. Returns 0 or -errno.
 */
int keys_start_zap(struct keys *k, void *ctx);

/** Make @sock a CURVE server (call before zmq_bind). Returns 0 or -errno. */
int keys_server(const struct keys *k, void *sock);

/** Make @sock a CURVE client of the server with public key @server (before zmq_connect). */
int keys_client(const struct keys *k, void *sock, const char *server);

/** Stop the ZAP thread (before the context is terminated) and free. NULL is a no-op. */
void keys_free(struct keys *k);

#endif /* HWFS_KEYS_H */
