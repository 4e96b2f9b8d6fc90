/*
 * store.c — the shard store: one directory, one arena, one index, one lock.
 *
 * Locking: the shard table (an open hash table with chaining, resized at
 * load factor 1) has one mutex; it is held for table changes and refcount
 * updates only, never across I/O.  Freeing a shard's arena range happens
 * under that mutex too, which keeps "refcount reached zero" and "range given
 * back" atomic with respect to a concurrent store_intern() of the same hash.
 *
 * The store lock file holds the pid of the owning daemon; flock() makes a
 * second daemon on the same store fail with -EBUSY, and a daemon killed with
 * SIGKILL releases it automatically.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "store.h"

struct store {
	char *dir;
	int lock_fd;
	struct arena *arena;
	struct index *index;
	pthread_mutex_t ix_lock;

	pthread_mutex_t tab_lock;
	struct shard **tab;
	size_t tab_size; /* power of two */
	size_t n_shards;
	uint64_t bytes;
};

static size_t slot_of(const struct store *s, const hwfs_hash_t *h)
{
	uint64_t v;

	memcpy(&v, h->b, sizeof(v));
	return (size_t)(v & (s->tab_size - 1));
}

static int tab_grow(struct store *s)
{
	size_t nsize = s->tab_size ? s->tab_size * 2 : 1024;
	struct shard **nt = calloc(nsize, sizeof(*nt));

	if (!nt)
		return -ENOMEM;
	for (size_t i = 0; i < s->tab_size; i++) {
		struct shard *sh = s->tab[i], *next;

		for (; sh; sh = next) {
			uint64_t v;

			next = sh->next;
			memcpy(&v, sh->hash.b, sizeof(v));
			sh->next = nt[v & (nsize - 1)];
			nt[v & (nsize - 1)] = sh;
		}
	}
	free(s->tab);
	s->tab = nt;
	s->tab_size = nsize;
	return 0;
}

static struct shard *tab_find(struct store *s, const hwfs_hash_t *h)
{
	struct shard *sh = s->tab[slot_of(s, h)];

	while (sh && hwfs_hash_cmp(&sh->hash, h))
		sh = sh->next;
	return sh;
}

/* Insert a new shard (the caller checked it is absent). Table lock held. */
static struct shard *tab_insert(struct store *s, const hwfs_hash_t *h, uint64_t off,
				uint64_t size)
{
	struct shard *sh;
	size_t slot;

	if (s->n_shards + 1 > s->tab_size && tab_grow(s) < 0)
		return NULL;
	sh = calloc(1, sizeof(*sh));
	if (!sh)
		return NULL;
	sh->hash = *h;
	sh->off = off;
	sh->size = size;
	slot = slot_of(s, h);
	sh->next = s->tab[slot];
	s->tab[slot] = sh;
	s->n_shards++;
	__atomic_add_fetch(&s->bytes, size, __ATOMIC_RELAXED); /* store_used_bytes() reads it */
	return sh;
}

/* Unlink @sh from the table, free its range and the struct. Table lock held. */
static void tab_remove(struct store *s, struct shard *sh)
{
	struct shard **pp = &s->tab[slot_of(s, &sh->hash)];

	while (*pp && *pp != sh)
		pp = &(*pp)->next;
	if (*pp)
		*pp = sh->next;
	s->n_shards--;
	__atomic_sub_fetch(&s->bytes, sh->size, __ATOMIC_RELAXED);
	if (sh->size)
		arena_free(s->arena, sh->off, sh->size);
	free(sh);
}

static uint64_t default_capacity(const char *dir)
{
	struct statvfs vfs;

	if (statvfs(dir, &vfs) < 0)
		return 4ull << 30;
	return (uint64_t)vfs.f_blocks * vfs.f_frsize / 4 * 3;
}

int store_capacity_verdict(uint64_t capacity, const struct store_room *room, char *msg,
			   size_t len)
{
	char a[32], b[32], c[32];
	uint64_t grow = capacity - HWFS_MIN(capacity, room->resident);

	msg[0] = '\0';
	if (room->fs_bytes && capacity > room->fs_bytes) {
		snprintf(msg, len, "--capacity %s is larger than the filesystem holding the store "
			 "(%s): writes would fail with ENOSPC before the arena is full",
			 hwfs_fmt_size(capacity, a, sizeof(a)),
			 hwfs_fmt_size(room->fs_bytes, b, sizeof(b)));
		return -EFBIG;
	}
	if (room->in_memory && grow > room->mem_free) {
		snprintf(msg, len, "--capacity %s: the store is in memory (tmpfs) and only %s of "
			 "RAM and swap is free (MemAvailable + SwapFree)%s%s%s; filling the arena "
			 "would end in swapping or the OOM killer",
			 hwfs_fmt_size(capacity, a, sizeof(a)),
			 hwfs_fmt_size(room->mem_free, b, sizeof(b)),
			 room->resident ? ", besides the " : "",
			 room->resident ? hwfs_fmt_size(room->resident, c, sizeof(c)) : "",
			 room->resident ? " the arena holds already" : "");
		return 1;
	}
	return 0;
}

/* MemAvailable + SwapFree of /proc/meminfo in bytes, or 0 when unreadable. */
static uint64_t mem_free_bytes(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	unsigned long long kb;
	uint64_t sum = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1 ||
		    sscanf(line, "SwapFree: %llu kB", &kb) == 1)
			sum += (uint64_t)kb * 1024;
	fclose(f);
	return sum;
}

int store_check_capacity(const char *dir, uint64_t capacity, char *msg, size_t len)
{
	struct store_room room = {0};
	struct statvfs vfs;
	struct statfs fs;
	struct stat st;
	char path[4096];

	msg[0] = '\0';
	if (statvfs(dir, &vfs) < 0 || statfs(dir, &fs) < 0)
		return -errno;
	room.fs_bytes = (uint64_t)vfs.f_blocks * vfs.f_frsize;
	room.in_memory = fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC;
	if (room.in_memory)
		room.mem_free = mem_free_bytes();
	snprintf(path, sizeof(path), "%s/arena", dir);
	if (stat(path, &st) == 0)
		room.resident = (uint64_t)st.st_blocks * 512;
	if (room.in_memory && !room.mem_free)
		room.in_memory = 0; /* no /proc/meminfo: nothing to compare with */
	return store_capacity_verdict(capacity, &room, msg, len);
}

/*
 * Is process @pid on its way out (PF_EXITING in /proc/PID/stat)?  A daemon
 * killed with SIGKILL keeps its store lock until the kernel has torn down its
 * address space, which can take a moment after kill(2) returned.
 */
static int pid_exiting(long pid)
{
	char path[64], buf[1024], *p;
	unsigned long flags = 0;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	p = strrchr(buf, ')'); /* the command name may hold spaces and ')' */
	/* after ") ": state ppid pgrp session tty_nr tpgid flags */
	if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %lu", &flags) != 1)
		return 0;
	return (flags & 0x4) != 0; /* PF_EXITING */
}

static int take_lock(struct store *s)
{
	char path[4096], buf[32];
	double give_up = hwfs_mono_s() + 10;
	int fd, n;

	snprintf(path, sizeof(path), "%s/lock", s->dir);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	while (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		n = (int)pread(fd, buf, sizeof(buf) - 1, 0);
		buf[n > 0 ? n : 0] = '\0';
		buf[strcspn(buf, "\n")] = '\0';
		if (n > 0 && pid_exiting(strtol(buf, NULL, 10)) && hwfs_mono_s() < give_up) {
			usleep(20000); /* the holder is dying: its lock goes with it */
			continue;
		}
		LOG_ERR("store %s is in use by pid %s", s->dir, n > 0 ? buf : "?");
		close(fd);
		return -EBUSY;
	}
	n = snprintf(buf, sizeof(buf), "%d\n", (int)getpid());
	if (ftruncate(fd, 0) < 0 || pwrite(fd, buf, (size_t)n, 0) != n)
		LOG_WARN("cannot record pid in %s", path);
	s->lock_fd = fd;
	return 0;
}

int store_open(const char *dir, uint64_t capacity, struct store **out)
{
	struct store *s = calloc(1, sizeof(*s));
	struct hwfs_shardloc *locs = NULL;
	size_t n_locs = 0;
	char path[4096];
	struct stat st;
	int r;

	if (!s)
		return -ENOMEM;
	s->lock_fd = -1;
	pthread_mutex_init(&s->ix_lock, NULL);
	pthread_mutex_init(&s->tab_lock, NULL);
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		r = -errno;
		goto fail;
	}
	s->dir = realpath(dir, NULL);
	if (!s->dir) {
		r = -errno;
		goto fail;
	}
	r = take_lock(s);
	if (r < 0)
		goto fail;
	snprintf(path, sizeof(path), "%s/arena", s->dir);
	if (capacity == 0)
		capacity = stat(path, &st) == 0 && st.st_size > 0 ? (uint64_t)st.st_size
								  : default_capacity(s->dir);
	r = arena_open(path, capacity, &s->arena);
	if (r < 0) {
		LOG_ERR("cannot open arena %s: %s", path, strerror(-r));
		goto fail;
	}
	snprintf(path, sizeof(path), "%s/index.db", s->dir);
	r = index_open(path, &s->index);
	if (r < 0)
		goto fail;
	r = tab_grow(s);
	if (r < 0)
		goto fail;
	r = index_load_shards(s->index, &locs, &n_locs);
	if (r < 0)
		goto fail;
	for (size_t i = 0; i < n_locs; i++) {
		if (!store_add_loaded(s, &locs[i])) {
			char hex[HWFS_HASH_HEX];

			hwfs_hash_hex(&locs[i].hash, hex);
			LOG_WARN("shard %s: range %llu+%llu unusable, ignored", hex,
				 (unsigned long long)locs[i].arena_off,
				 (unsigned long long)locs[i].size);
		}
	}
	free(locs);
	*out = s;
	return 0;
fail:
	free(locs);
	store_close(s);
	return r;
}

void store_close(struct store *s)
{
	if (!s)
		return;
	if (s->tab) {
		for (size_t i = 0; i < s->tab_size; i++) {
			struct shard *sh = s->tab[i], *next;

			for (; sh; sh = next) {
				next = sh->next;
				free(sh);
			}
		}
		free(s->tab);
	}
	index_close(s->index);
	arena_close(s->arena);
	if (s->lock_fd >= 0)
		close(s->lock_fd);
	pthread_mutex_destroy(&s->ix_lock);
	pthread_mutex_destroy(&s->tab_lock);
	free(s->dir);
	free(s);
}

struct arena *store_arena(struct store *s)
{
	return s->arena;
}

int store_load_versions(struct store *s, struct hwfs_vrec ***vs, size_t *n, char **current)
{
	char *cur = NULL;
	int r;

	pthread_mutex_lock(&s->ix_lock);
	r = index_load(s->index, vs, n);
	if (r == 0 && index_meta_get(s->index, "current", &cur) < 0)
		cur = NULL; /* no commit yet */
	pthread_mutex_unlock(&s->ix_lock);
	if (r == 0)
		*current = cur;
	return r;
}

int store_put_version(struct store *s, const struct hwfs_vrec *v,
		      const struct hwfs_shardloc *locs, size_t n_locs)
{
	int r;

	pthread_mutex_lock(&s->ix_lock);
	r = index_put_version(s->index, v, locs, n_locs);
	pthread_mutex_unlock(&s->ix_lock);
	return r;
}

int store_delete_version(struct store *s, const char *name)
{
	int r;

	pthread_mutex_lock(&s->ix_lock);
	r = index_delete_version(s->index, name);
	pthread_mutex_unlock(&s->ix_lock);
	return r;
}

int store_set_state(struct store *s, const char *name, enum hwfs_vstate st)
{
	int r;

	pthread_mutex_lock(&s->ix_lock);
	r = index_set_state(s->index, name, st);
	pthread_mutex_unlock(&s->ix_lock);
	return r;
}

int store_set_current(struct store *s, const char *name)
{
	return store_meta_set(s, "current", name);
}

int store_meta_get(struct store *s, const char *key, char **val)
{
	int r;

	pthread_mutex_lock(&s->ix_lock);
	r = index_meta_get(s->index, key, val);
	pthread_mutex_unlock(&s->ix_lock);
	return r;
}

int store_meta_set(struct store *s, const char *key, const char *val)
{
	int r;

	pthread_mutex_lock(&s->ix_lock);
	r = index_meta_set(s->index, key, val);
	pthread_mutex_unlock(&s->ix_lock);
	return r;
}

int store_stage_alloc(struct store *s, uint64_t len, int unbacked, uint64_t *off)
{
	return unbacked ? arena_alloc_unbacked(s->arena, len, off) : arena_alloc(s->arena, len, off);
}

int store_stage_extend(struct store *s, uint64_t off, uint64_t len, uint64_t newlen)
{
	return arena_extend(s->arena, off, len, newlen);
}

void store_stage_free(struct store *s, uint64_t off, uint64_t len)
{
	arena_free(s->arena, off, len);
}

int store_stage_write(struct store *s, uint64_t off, const void *buf, size_t len)
{
	size_t done = 0;

	if (arena_preallocated(s->arena)) {
		memcpy(arena_base(s->arena) + off, buf, len);
		return 0;
	}
	while (done < len) {
		ssize_t n = pwrite(arena_fd(s->arena), (const char *)buf + done, len - done,
				   (off_t)(off + done));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		done += (size_t)n;
	}
	return 0;
}

uint64_t store_stage_room(struct store *s)
{
	uint64_t cap = arena_capacity(s->arena), used = arena_used(s->arena);

	return cap > used ? cap - used : 0;
}

struct shard *store_intern_staged(struct store *s, const hwfs_hash_t *h, uint64_t off,
				  uint64_t len)
{
	int adopted = 0;
	struct shard *sh = store_intern(s, h, off, len, &adopted);

	if (!adopted)
		arena_free(s->arena, off, len);
	return sh;
}

const char *store_dir(const struct store *s)
{
	return s->dir;
}

struct shard *store_lookup(struct store *s, const hwfs_hash_t *h)
{
	struct shard *sh;

	pthread_mutex_lock(&s->tab_lock);
	sh = tab_find(s, h);
	pthread_mutex_unlock(&s->tab_lock);
	return sh;
}

struct shard *store_intern(struct store *s, const hwfs_hash_t *h, uint64_t off, uint64_t len,
			   int *adopted)
{
	struct shard *sh;

	pthread_mutex_lock(&s->tab_lock);
	sh = tab_find(s, h);
	if (sh) {
		sh->refs++;
		*adopted = 0;
	} else {
		sh = tab_insert(s, h, off, len);
		if (sh) {
			sh->refs = 1;
			*adopted = 1;
		}
	}
	pthread_mutex_unlock(&s->tab_lock);
	return sh;
}

struct shard *store_add_loaded(struct store *s, const struct hwfs_shardloc *loc)
{
	struct shard *sh = NULL;

	pthread_mutex_lock(&s->tab_lock);
	if (tab_find(s, &loc->hash))
		goto out;
	if (loc->size && arena_reserve(s->arena, loc->arena_off, loc->size) < 0)
		goto out;
	sh = tab_insert(s, &loc->hash, loc->arena_off, loc->size);
	if (!sh && loc->size)
		arena_free(s->arena, loc->arena_off, loc->size);
out:
	pthread_mutex_unlock(&s->tab_lock);
	return sh;
}

struct shard *store_get(struct store *s, const hwfs_hash_t *h)
{
	struct shard *sh;

	pthread_mutex_lock(&s->tab_lock);
	sh = tab_find(s, h);
	if (sh)
		sh->refs++;
	pthread_mutex_unlock(&s->tab_lock);
	return sh;
}

void store_ref(struct store *s, struct shard *sh)
{
	pthread_mutex_lock(&s->tab_lock);
	sh->refs++;
	pthread_mutex_unlock(&s->tab_lock);
}

void store_unref(struct store *s, struct shard *sh)
{
	pthread_mutex_lock(&s->tab_lock);
	if (--sh->refs == 0)
		tab_remove(s, sh);
	pthread_mutex_unlock(&s->tab_lock);
}

size_t store_drop_unreferenced(struct store *s)
{
	size_t n = 0;

	pthread_mutex_lock(&s->tab_lock);
	for (size_t i = 0; i < s->tab_size; i++) {
		struct shard *sh = s->tab[i], *next;

		for (; sh; sh = next) {
			next = sh->next;
			if (sh->refs == 0) {
				tab_remove(s, sh);
				n++;
			}
		}
	}
	pthread_mutex_unlock(&s->tab_lock);
	return n;
}

uint64_t store_used_bytes(const struct store *s)
{
	return __atomic_load_n(&s->bytes, __ATOMIC_RELAXED);
}

void store_usage(struct store *s, uint64_t *bytes, uint64_t *count)
{
	pthread_mutex_lock(&s->tab_lock);
	*bytes = s->bytes;
	*count = s->n_shards;
	pthread_mutex_unlock(&s->tab_lock);
}
