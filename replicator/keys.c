/*
 * keys.c — CURVE key files and the ZAP handler (see keys.h).
 *
 * The ZAP handler is one thread per ZeroMQ context with a REP socket on
 * inproc://zeromq.zap.01, as the ZAP RFC (27) prescribes: for each CURVE
 * handshake libzmq sends it the client's public key and sends the client
 * away unless the answer is 200.  The authorized set is read once at start;
 * adding a node means adding its key file and restarting the process.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "keys.h"

struct keys {
	char pub[KEY_Z85], sec[KEY_Z85], coord[KEY_Z85];
	uint8_t (*authorized)[32];
	size_t n_authorized;
	void *zap;
	pthread_t thread;
	int running, stop;
	char last_refused[KEY_Z85]; /* the log names a refused key once a minute */
	double last_refused_at;
};

static int write_file(const char *path, const char *text, mode_t mode)
{
	FILE *f;
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);

	if (fd < 0)
		return -errno;
	f = fdopen(fd, "w");
	if (!f) {
		close(fd);
		return -errno;
	}
	if (fputs(text, f) < 0 || fclose(f) != 0)
		return -EIO;
	return 0;
}

/* First line of @path (a Z85 key) into @out. */
static int read_key(const char *path, char out[KEY_Z85], int line)
{
	char buf[256];
	FILE *f = fopen(path, "r");
	int r = -EINVAL;

	if (!f)
		return -errno;
	for (int i = 0; i <= line; i++)
		if (!fgets(buf, sizeof(buf), f))
			goto out;
	buf[strcspn(buf, "\r\n")] = '\0';
	if (strlen(buf) == KEY_Z85 - 1) {
		uint8_t raw[32];

		if (zmq_z85_decode(raw, buf)) {
			memcpy(out, buf, KEY_Z85);
			r = 0;
		}
	}
out:
	fclose(f);
	return r;
}

int keys_generate(const char *dir, char pub[KEY_Z85])
{
	char sec[KEY_Z85], path[4096], text[128];
	int r;

	if (zmq_curve_keypair(pub, sec) != 0)
		return -ENOTSUP; /* libzmq built without CURVE */
	if (mkdir(dir, 0700) < 0 && errno != EEXIST)
		return -errno;
	snprintf(path, sizeof(path), "%s/key", dir);
	if (access(path, F_OK) == 0)
		return -EEXIST;
	snprintf(text, sizeof(text), "%s\n%s\n", pub, sec);
	r = write_file(path, text, 0600);
	if (r < 0)
		return r;
	snprintf(path, sizeof(path), "%s/key.pub", dir);
	snprintf(text, sizeof(text), "%s\n", pub);
	r = write_file(path, text, 0644);
	if (r < 0)
		return r;
	snprintf(path, sizeof(path), "%s/authorized", dir);
	if (mkdir(path, 0700) < 0 && errno != EEXIST)
		return -errno;
	snprintf(path, sizeof(path), "%s/authorized/self.pub", dir);
	return write_file(path, text, 0644);
}

static int add_authorized(struct keys *k, const char *path)
{
	char z[KEY_Z85];
	uint8_t (*na)[32];

	if (read_key(path, z, 0) < 0) {
		LOG_WARN("keys: %s is not a public key; ignored", path);
		return 0;
	}
	na = realloc(k->authorized, (k->n_authorized + 1) * sizeof(*na));
	if (!na)
		return -ENOMEM;
	k->authorized = na;
	zmq_z85_decode(k->authorized[k->n_authorized++], z);
	return 0;
}

int keys_load(const char *dir, struct keys **out)
{
	struct keys *k = calloc(1, sizeof(*k));
	char path[4096];
	struct dirent *e;
	DIR *d;
	int r;

	if (!k)
		return -ENOMEM;
	snprintf(path, sizeof(path), "%s/key", dir);
	r = read_key(path, k->pub, 0);
	if (r == 0)
		r = read_key(path, k->sec, 1);
	if (r < 0) {
		LOG_ERR("keys: %s: %s", path, r == -EINVAL ? "malformed key file" : strerror(-r));
		free(k);
		return r == -EINVAL ? -EINVAL : -ENOENT;
	}
	snprintf(path, sizeof(path), "%s/coordinator.pub", dir);
	if (read_key(path, k->coord, 0) < 0)
		k->coord[0] = '\0';
	snprintf(path, sizeof(path), "%s/authorized", dir);
	d = opendir(path);
	while (d && (e = readdir(d))) {
		size_t len = strlen(e->d_name);

		if (len < 5 || strcmp(e->d_name + len - 4, ".pub"))
			continue;
		snprintf(path, sizeof(path), "%s/authorized/%s", dir, e->d_name);
		if (add_authorized(k, path) < 0) {
			closedir(d);
			keys_free(k);
			return -ENOMEM;
		}
	}
	if (d)
		closedir(d);
	*out = k;
	return 0;
}

const char *keys_public(const struct keys *k)
{
	return k->pub;
}

const char *keys_coordinator(const struct keys *k)
{
	return k->coord[0] ? k->coord : NULL;
}

static int authorized(const struct keys *k, const void *key, size_t len)
{
	if (len != 32)
		return 0;
	for (size_t i = 0; i < k->n_authorized; i++)
		if (!memcmp(k->authorized[i], key, 32))
			return 1;
	return 0;
}

/* One ZAP exchange: 7 request frames in (version, id, domain, address,
 * identity, mechanism, credentials), 6 reply frames out. */
static void zap_once(struct keys *k)
{
	zmq_msg_t f[8];
	int n = 0, more = 1, ok;
	char z[KEY_Z85] = "?";

	while (more && n < 8) {
		zmq_msg_init(&f[n]);
		if (zmq_msg_recv(&f[n], k->zap, 0) < 0) {
			zmq_msg_close(&f[n]);
			break;
		}
		more = zmq_msg_more(&f[n]);
		n++;
	}
	while (more) { /* drain a malformed request */
		zmq_msg_t x;

		zmq_msg_init(&x);
		if (zmq_msg_recv(&x, k->zap, 0) < 0)
			more = 0;
		else
			more = zmq_msg_more(&x);
		zmq_msg_close(&x);
	}
	ok = n >= 7 && zmq_msg_size(&f[5]) == 5 && !memcmp(zmq_msg_data(&f[5]), "CURVE", 5) &&
	     authorized(k, zmq_msg_data(&f[6]), zmq_msg_size(&f[6]));
	if (n >= 7 && zmq_msg_size(&f[6]) == 32)
		zmq_z85_encode(z, zmq_msg_data(&f[6]), 32);
	if (!ok && (strcmp(z, k->last_refused) || hwfs_mono_s() - k->last_refused_at > 60)) {
		LOG_WARN("keys: refused a connection with unknown key %s", z);
		snprintf(k->last_refused, sizeof(k->last_refused), "%s", z);
		k->last_refused_at = hwfs_mono_s();
	}
	if (n >= 2) {
		zmq_send(k->zap, "1.0", 3, ZMQ_SNDMORE);
		zmq_send(k->zap, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
		zmq_send(k->zap, ok ? "200" : "400", 3, ZMQ_SNDMORE);
		zmq_send(k->zap, ok ? "OK" : "unknown key", ok ? 2 : 11, ZMQ_SNDMORE);
		zmq_send(k->zap, z, strlen(z), ZMQ_SNDMORE);
		zmq_send(k->zap, "", 0, 0);
	}
	for (int i = 0; i < n; i++)
		zmq_msg_close(&f[i]);
}

static void *zap_main(void *arg)
{
	struct keys *k = arg;

	while (!__atomic_load_n(&k->stop, __ATOMIC_RELAXED)) {
		zmq_pollitem_t it = {k->zap, 0, ZMQ_POLLIN, 0};

		if (zmq_poll(&it, 1, 100) < 0 && errno != EINTR)
			break;
		if (it.revents & ZMQ_POLLIN)
			zap_once(k);
	}
	return NULL;
}

int keys_start_zap(struct keys *k, void *ctx)
{
	int linger = 0;

	k->zap = zmq_socket(ctx, ZMQ_REP);
	if (!k->zap)
		return -errno;
	zmq_setsockopt(k->zap, ZMQ_LINGER, &linger, sizeof(linger));
	if (zmq_bind(k->zap, "inproc://zeromq.zap.01") < 0) {
		int r = -errno;

		zmq_close(k->zap);
		k->zap = NULL;
		return r;
	}
	if (pthread_create(&k->thread, NULL, zap_main, k) != 0) {
		zmq_close(k->zap);
		k->zap = NULL;
		return -EAGAIN;
	}
	k->running = 1;
	return 0;
}

int keys_server(const struct keys *k, void *sock)
{
	int one = 1;

	if (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof(one)) < 0 ||
	    zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, k->sec, KEY_Z85 - 1) < 0 ||
	    zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, "hwfs", 4) < 0)
		return -errno;
	return 0;
}

int keys_client(const struct keys *k, void *sock, const char *server)
{
	if (!server || strlen(server) != KEY_Z85 - 1)
		return -EINVAL;
	if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, server, KEY_Z85 - 1) < 0 ||
	    zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, k->pub, KEY_Z85 - 1) < 0 ||
	    zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, k->sec, KEY_Z85 - 1) < 0)
		return -errno;
	return 0;
}

void keys_free(struct keys *k)
{
	if (!k)
		return;
	if (k->running) {
		__atomic_store_n(&k->stop, 1, __ATOMIC_RELAXED);
		pthread_join(k->thread, NULL);
	}
	if (k->zap)
		zmq_close(k->zap);
	free(k->authorized);
	explicit_bzero(k->sec, sizeof(k->sec));
	free(k);
}
